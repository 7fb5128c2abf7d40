"""Pictures of screens, actions and values; the Q/V viewers.

- :mod:`digiq.viz.draw`: screenshots with actions or candidates drawn on them, contact sheets, a figure as a PNG.
- :mod:`digiq.viz.charts`: the results' bar charts.
- :mod:`digiq.viz.values`: the pipeline's data scored by a critic (:func:`~digiq.viz.values.load_values`).
- :mod:`digiq.viz.viewers`: the ipywidgets trajectory and action viewers.

The package imports none of them itself, so that drawing a screen does not load the critic's code, and no
stage's notebook runs the viewers (its fingerprint, :mod:`digiq.fingerprint`, holds only what it imports).
"""
