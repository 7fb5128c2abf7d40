"""What only a simulator can tell about a critic, and the stage that reports it.

- :mod:`~digiq.diagnostics.ground_truth`: stored states rebuilt, true values of
  their candidates under the expert and under the data's own policy, the
  expert's choice at each state.
- :mod:`~digiq.diagnostics.probes`: models fit on the critic's inputs to
  those answers (what the inputs allow).
- :mod:`~digiq.diagnostics.reports`: the critic's picks judged against both.
"""
