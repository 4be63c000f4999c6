"""Example models exported as bundles: ``python -m examples.<name>.export --out DIR``."""
