"""PAE (Proposer-Agent-Evaluator) on a phone: tasks nobody wrote, practised and judged without ground truth.

- :mod:`digiq.pae.crawl`: what a fresh device offers, read off its view hierarchies (:mod:`digiq.pae.context`);
- :mod:`digiq.pae.lexicon`: the built-in proposer's declared world knowledge;
- :mod:`digiq.pae.proposals`: one task per line, with its context and where each of its words came from;
- :mod:`digiq.pae.propose`: the built-in proposer, from the crawl and the lexicon;
- :mod:`digiq.pae.propose_llm`: a chat LLM as proposer, in PAE's prompt shape.
"""
