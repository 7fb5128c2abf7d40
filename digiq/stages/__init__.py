"""The pipeline's stages, one module per DVC stage, in order.

``base_policy`` (00), ``collect`` (01), ``augment_actions`` (02),
``vlm_finetune`` (03), ``embed`` (04), ``critic`` (05), ``actor`` (06) and
``eval`` (07); each stage's notebook calls its module. ``launch`` runs a
training stage in one process or several; ``common`` holds what every stage
does alike (read task lists, write metrics, time itself, draw a curve).
"""
