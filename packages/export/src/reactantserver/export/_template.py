"""The ``model.py`` template written by ``--with-hooks``: identity hooks to edit."""

from __future__ import annotations

from collections.abc import Sequence

from reactantserver.export._spec import TensorDecl

__all__ = ["hooks_template"]

_TEMPLATE = '''"""Hooks of the {name!r} bundle.

The server imports this file when it loads the bundle and injects register_model,
register_meta_model, NamedTensor, InvalidArgumentError and BUNDLE_DIR. Importing them from
reactantserver.core.hooks, as below, works too. Hooks run on many threads at once: keep no
per-request state in globals, and copy an input before changing it (it may be read-only).
"""

from reactantserver.core.hooks import NamedTensor, register_model


def preprocess(inputs: list[NamedTensor]) -> list[NamedTensor]:
    """Client inputs -> executable inputs.

    Receives: {client_inputs}
    Returns:  {executable_inputs}
    """
    return inputs


def postprocess(outputs: list[NamedTensor]) -> list[NamedTensor]:
    """Executable outputs -> client outputs.

    Receives: {executable_outputs}
    Returns:  {client_outputs}
    """
    return outputs


register_model({name!r}, preprocess=preprocess, postprocess=postprocess)
'''


def _listing(decls: Sequence[TensorDecl]) -> str:
    return ", ".join(str(d) for d in decls) or "(none)"


def hooks_template(
    name: str,
    executable_inputs: Sequence[TensorDecl],
    executable_outputs: Sequence[TensorDecl],
    client_inputs: Sequence[TensorDecl] | None = None,
    client_outputs: Sequence[TensorDecl] | None = None,
) -> str:
    """The source of an identity-hook ``model.py`` for a bundle."""
    return _TEMPLATE.format(
        name=name,
        executable_inputs=_listing(executable_inputs),
        executable_outputs=_listing(executable_outputs),
        client_inputs=_listing(executable_inputs if client_inputs is None else client_inputs),
        client_outputs=_listing(executable_outputs if client_outputs is None else client_outputs),
    )
