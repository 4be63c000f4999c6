"""A two-stage pipeline: sub-models ``pipeline_embed`` and ``pipeline_score`` behind the meta
model ``pipeline``."""
