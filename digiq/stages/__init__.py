"""One module per notebook stage of ``dvc.yaml``, named as the stage; :mod:`digiq.pipeline` lists them in order.

Each stage's notebook calls its module, which loads the stage's inputs,
calls the learning rules (:mod:`digiq.algos`) or the models, and saves what
they return with the stage's metrics. ``launch`` runs a training stage in one
process or several; ``common`` holds what every stage does alike (read task
lists, write metrics, time itself, draw a curve).
"""
