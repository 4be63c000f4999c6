"""The GPU kit: one prepared run that shows the product on a real accelerator (see README.md)."""
