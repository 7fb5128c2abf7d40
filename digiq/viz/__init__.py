"""Pictures of screens, actions and values; the Q/V viewers.

- :mod:`digiq.viz.draw`: screenshots with actions drawn on them, contact sheets.
- :mod:`digiq.viz.values`: the pipeline's data scored by a critic (:func:`~digiq.viz.values.load_values`).
- :mod:`digiq.viz.viewers`: the ipywidgets trajectory and action viewers.

The package imports none of them itself, so that drawing a screen does not load the critic's code.
"""
