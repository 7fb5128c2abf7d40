"""The learning rules, one file each, readable top to bottom: arrays and models in, models and picks out.

- :mod:`digiq.algos.digiq`: Digi-Q's critic (TD on frozen VLM features) and actor (Best-of-N);
- :mod:`digiq.algos.digirl`: DigiRL's success classifiers, step advantage and filters;
- :mod:`digiq.algos.filtered_bc`: Filtered BC, the successful trajectories' own steps;
- :mod:`digiq.algos.pae`: PAE's Filtered BC, the shortest of each task's successes as the evaluator judged them.

Nothing here reads or writes a file or schedules a job: the stages
(:mod:`digiq.stages`) load the data, call these and save what they return.
"""
