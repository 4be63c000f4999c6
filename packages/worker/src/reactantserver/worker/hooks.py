"""Loads a bundle's ``model.py`` and runs its hooks with their outputs checked.

:func:`load_hooks` imports ``model.py`` (at load time, on the loader thread) and returns what it
registered; :func:`run_preprocess` / :func:`run_postprocess` call a hook and check what it
returned against the manifest. Both are synchronous: the handler runs them in the hook pool, so
the event loop never executes hook code::

    hooks = load_hooks(bundle_dir, manifest, generation=3)
    pool = hook_pool(hook_pool_size(config))
    executable = await run_in_pool(
        pool, run_preprocess, manifest.name, hooks, request.inputs, manifest.executable_inputs
    )
    ...
    client = await run_in_pool(
        pool, run_postprocess, manifest.name, hooks, outputs, manifest.client_outputs
    )

Errors: a broken ``model.py`` is a :class:`~reactantserver.core.errors.BundleError` (the model
does not load); a hook that raises, or returns tensors that break the manifest's specs, is a
:class:`HookError` (``INTERNAL``); an
:class:`~reactantserver.core.errors.InvalidArgumentError` raised by a hook passes through
unchanged (``INVALID_ARGUMENT``, the client's fault).

``sys.modules``: ``model.py`` runs under the unique name :func:`bundle_module_name` and is
present in ``sys.modules`` only *while it executes* (so import-time code that looks its own
module up, such as ``dataclasses``, ``typing.get_type_hints`` or ``enum``, works). It is removed
again afterwards: every reload uses a new generation and so a new name, and keeping them would
pin each old generation's module (and whatever it loaded from ``BUNDLE_DIR``) for the life of the
worker. The hooks keep working without the entry (functions hold their module's globals), and
:attr:`BundleHooks.module` keeps the module object alive for exactly as long as the generation
is referenced. ``model.py`` is compiled from source on every load; no ``__pycache__`` is read or
written in the bundle directory (a stale ``.pyc`` could otherwise shadow a rewritten file of the
same size within the same second, and writes would touch a published bundle).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import importlib.machinery
import importlib.util
import os
import re
import sys
import traceback
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TypeAlias, TypeVar, TypeVarTuple

import attrs

from reactantserver.core.config import WorkerConfig
from reactantserver.core.errors import BundleError, InvalidArgumentError, ReactantError
from reactantserver.core.hooks import (
    Hook,
    MetaCall,
    NamedTensor,
    Registration,
    collect_registrations,
    register_meta_model,
    register_model,
)
from reactantserver.core.manifest import MODEL_PY_FILENAME, Manifest
from reactantserver.core.types import TensorSpec
from reactantserver.worker.validation import batch_rows, check_tensor

__all__ = [
    "MODULE_NAME_PREFIX",
    "THREAD_NAME_PREFIX",
    "BundleHooks",
    "HookError",
    "MetaRun",
    "bundle_module_name",
    "check_hook_output",
    "hook_pool",
    "hook_pool_size",
    "load_hooks",
    "run_in_pool",
    "run_postprocess",
    "run_preprocess",
]

#: Prefix of the module name a bundle's ``model.py`` is imported under.
MODULE_NAME_PREFIX: Final = "reactantserver_bundle_"
#: Name prefix of the hook-pool threads (``reactant-hook_0``, ``reactant-hook_1``, …).
THREAD_NAME_PREFIX: Final = "reactant-hook"

#: A meta model's ``run(inputs, call)``.
MetaRun: TypeAlias = Callable[[list[NamedTensor], MetaCall], list[NamedTensor]]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


@attrs.frozen
class BundleHooks:
    """What a bundle's ``model.py`` registered; all ``None`` for a bundle without one.

    ``source`` is the ``model.py`` that was imported; ``module`` the module object it ran in
    (not in ``sys.modules``; kept so the generation's globals live as long as its hooks).
    """

    preprocess: Hook | None = None
    postprocess: Hook | None = None
    run: MetaRun | None = None
    source: Path | None = None
    module: types.ModuleType | None = attrs.field(default=None, eq=False, repr=False)


class HookError(ReactantError):
    """A hook raised, or returned something that breaks the manifest's specs: a server-side bug.

    Maps to ``INTERNAL``; the message names the model, the hook and (where relevant) the tensor.
    """


# --------------------------------------------------------------------------------------------
# Loading


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles ``model.py`` from source every time: never reads or writes ``__pycache__``."""

    def get_code(self, fullname: str) -> types.CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


def bundle_module_name(name: str, generation: int) -> str:
    """The module name ``model.py`` of bundle ``name`` runs under in ``generation``.

    ``reactantserver_bundle_<name>_<generation>``, with every character that cannot appear in
    an identifier (``.`` and ``-`` in valid model names) replaced by ``_``.
    """
    if generation < 0:
        raise ValueError(f"generation must be >= 0, got {generation}")
    return f"{MODULE_NAME_PREFIX}{_NOT_IDENTIFIER.sub('_', name)}_{generation}"


def _failure_site(exc: BaseException, source: Path) -> str:
    """`` at line N`` of the innermost traceback frame inside ``source`` (``""`` if none)."""
    if isinstance(exc, SyntaxError):
        return ""  # its text already names the file and line
    lineno: int | None = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == str(source):
            lineno = frame.lineno
    return f" at line {lineno}" if lineno is not None else ""


def _describe(registration: Registration) -> str:
    function = "register_model" if registration.kind == "model" else "register_meta_model"
    return f"{function}({registration.name!r})"


def _import(
    source: Path, module_name: str, bundle_dir: Path
) -> tuple[types.ModuleType, list[Registration]]:
    """Execute ``source`` as a fresh module; returns it and the registrations it made."""
    loader = _SourceOnlyLoader(module_name, str(source))
    spec = importlib.util.spec_from_file_location(module_name, source, loader=loader)
    if spec is None:  # pragma: no cover - a file location with an explicit loader always works
        raise BundleError(f"{source}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(
        register_model=register_model,
        register_meta_model=register_meta_model,
        NamedTensor=NamedTensor,
        InvalidArgumentError=InvalidArgumentError,
        BUNDLE_DIR=bundle_dir,
    )
    # Present in sys.modules only while it runs (see the module docstring). A name already
    # taken (two bundles whose names sanitise alike, loading at the same instant) is left alone.
    registered = sys.modules.setdefault(module_name, module) is module
    try:
        with collect_registrations() as registrations:
            try:
                loader.exec_module(module)
            except (Exception, SystemExit) as exc:
                cause = f"{type(exc).__name__}: {exc}"
                raise BundleError(
                    f"{source}: import failed{_failure_site(exc, source)}: {cause}"
                ) from exc
    finally:
        if registered and sys.modules.get(module_name) is module:
            del sys.modules[module_name]
    return module, list(registrations)


def _check_registrations(
    source: Path, manifest: Manifest, registrations: Sequence[Registration]
) -> Registration:
    expected = "register_meta_model" if manifest.is_meta else "register_model"
    if not registrations:
        raise BundleError(
            f"{source}: registers nothing; a bundle of kind: {manifest.kind} must call "
            f"{expected}() exactly once"
        )
    if len(registrations) > 1:
        calls = ", ".join(_describe(r) for r in registrations)
        raise BundleError(
            f"{source}: {len(registrations)} registrations ({calls}); a bundle of kind: "
            f"{manifest.kind} must call {expected}() exactly once"
        )
    (registration,) = registrations
    if registration.kind != manifest.kind:
        raise BundleError(
            f"{source}: calls {_describe(registration)} but the manifest declares kind: "
            f"{manifest.kind}, which must call {expected}()"
        )
    hooks: dict[str, object] = {
        "preprocess": registration.preprocess,
        "postprocess": registration.postprocess,
        "run": registration.run,
    }
    for hook, value in hooks.items():
        if value is not None and not callable(value):
            raise BundleError(
                f"{source}: {_describe(registration)} passes {hook}="
                f"{type(value).__name__}, which is not callable"
            )
    if manifest.is_meta and registration.run is None:
        raise BundleError(f"{source}: {_describe(registration)} passes run=None")
    return registration


def load_hooks(bundle_dir: Path, manifest: Manifest, *, generation: int = 1) -> BundleHooks:
    """Import ``bundle_dir/model.py`` and return the hooks it registered.

    Without ``model.py``: no hooks for a model, :class:`BundleError` for a meta. The module
    runs under :func:`bundle_module_name` ``(manifest.name, generation)``, with
    ``register_model``, ``register_meta_model``, ``NamedTensor``, ``InvalidArgumentError`` and
    ``BUNDLE_DIR`` (the absolute bundle directory) injected; the bundle directory is not added
    to ``sys.path``. Any exception during the import, zero or several registrations, or the
    wrong kind → :class:`BundleError` naming ``model.py`` and the cause.
    """
    module_name = bundle_module_name(manifest.name, generation)
    bundle_dir = Path(os.path.abspath(bundle_dir))
    source = bundle_dir / MODEL_PY_FILENAME
    if not source.is_file():
        if manifest.is_meta:
            raise BundleError(f"{source}: missing: required for kind: meta (it registers run)")
        return BundleHooks()
    module, registrations = _import(source, module_name, bundle_dir)
    registration = _check_registrations(source, manifest, registrations)
    return BundleHooks(
        preprocess=registration.preprocess,
        postprocess=registration.postprocess,
        run=registration.run,
        source=source,
        module=module,
    )


# --------------------------------------------------------------------------------------------
# Running


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _index(where: str, result: object) -> dict[str, NamedTensor]:
    """The returned tensors by name: a sequence of ``NamedTensor`` without repeated names."""
    if not isinstance(result, Sequence) or isinstance(result, str | bytes | bytearray):
        raise HookError(f"{where} returned {_type_name(result)}, expected a list of NamedTensor")
    by_name: dict[str, NamedTensor] = {}
    for position, item in enumerate(result):
        if not isinstance(item, NamedTensor):
            raise HookError(
                f"{where} returned {_type_name(item)} at position {position}, expected NamedTensor"
            )
        if item.name in by_name:
            raise HookError(f"{where} returned tensor '{item.name}' more than once")
        by_name[item.name] = item
    return by_name


def _check_tensor(where: str, model: str, spec: TensorSpec, tensor: NamedTensor) -> None:
    try:
        got = tensor.dtype.token
    except ValueError:
        got = str(tensor.data.dtype)
    if got != spec.dtype.token:
        # Compared by manifest token: that is how a hook author wrote the tensor spec.
        raise HookError(
            f"{where} returned tensor '{spec.name}' with dtype {got}, expected {spec.dtype.token}"
        )
    try:
        check_tensor(spec, tensor.data, model=model, kind="tensor")
    except InvalidArgumentError as exc:
        raise HookError(
            f"{where} returned tensor '{spec.name}' that breaks its spec: {exc}"
        ) from None


def check_hook_output(
    model: str,
    hook: str,
    result: object,
    specs: Sequence[TensorSpec],
    *,
    same_rows: bool = False,
) -> list[NamedTensor]:
    """Check what hook ``hook`` of ``model`` returned against ``specs``; return it in spec order.

    ``result`` must be a sequence of :class:`NamedTensor` whose names are exactly the specs'
    names (order irrelevant), each with the tensor spec's dtype, rank and FIXED extents; with
    ``same_rows`` the batched tensors must also agree on one row count (>= 1). Any violation
    -> :class:`HookError` naming the hook and the tensor. Also usable for a meta's ``run``
    (``hook="run"``, client output specs).
    """
    where = f"{hook} hook of model '{model}'"
    by_name = _index(where, result)
    declared = [spec.name for spec in specs]
    expected = ", ".join(declared) or "none"
    for name in by_name:
        if name not in declared:
            raise HookError(f"{where} returned unexpected tensor '{name}' (expected: {expected})")
    ordered: list[NamedTensor] = []
    for spec in specs:
        tensor = by_name.get(spec.name)
        if tensor is None:
            raise HookError(f"{where} did not return tensor '{spec.name}'")
        _check_tensor(where, model, spec, tensor)
        ordered.append(tensor)
    if same_rows:
        try:
            batch_rows(specs, [t.data for t in ordered], model=model)
        except InvalidArgumentError as exc:
            raise HookError(f"{where} returned an invalid batch: {exc}") from None
    return ordered


def _call(model: str, name: str, hook: Hook | None, tensors: list[NamedTensor]) -> object:
    if hook is None:
        return tensors
    try:
        return hook(list(tensors))
    except InvalidArgumentError:
        raise
    except (Exception, SystemExit) as exc:
        raise HookError(
            f"{name} hook of model '{model}' raised {type(exc).__name__}: {exc}"
        ) from exc


def run_preprocess(
    model: str,
    hooks: BundleHooks,
    tensors: list[NamedTensor],
    specs: Sequence[TensorSpec],
) -> list[NamedTensor]:
    """Client inputs → executable inputs (``specs``), in spec order; identity without a hook.

    Runs the hook synchronously (call it in the hook pool). The result is checked like
    :func:`check_hook_output` with ``same_rows``.
    """
    result = _call(model, "preprocess", hooks.preprocess, tensors)
    return check_hook_output(model, "preprocess", result, specs, same_rows=True)


def run_postprocess(
    model: str,
    hooks: BundleHooks,
    tensors: list[NamedTensor],
    specs: Sequence[TensorSpec],
) -> list[NamedTensor]:
    """Executable outputs → client outputs (``specs``), in spec order; identity without a hook.

    Runs the hook synchronously (call it in the hook pool). The result is checked like
    :func:`check_hook_output` (no row-count rule).
    """
    result = _call(model, "postprocess", hooks.postprocess, tensors)
    return check_hook_output(model, "postprocess", result, specs)


# --------------------------------------------------------------------------------------------
# The hook pool


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return os.cpu_count() or 1


def hook_pool_size(config: WorkerConfig | None = None) -> int:
    """Threads of the hook pool: ``REACTANTSERVER_WORKER_THREADS`` else ``min(cpu_count, 16)``.

    The variable is read by :func:`~reactantserver.core.config.load_worker_config` into
    ``config.hook_threads``; without a ``config`` the default applies. ``cpu_count`` counts the
    CPUs this process may run on.
    """
    return (config or WorkerConfig()).hook_pool_size(_usable_cpus())


def hook_pool(size: int | None = None) -> concurrent.futures.ThreadPoolExecutor:
    """A thread pool for hooks, meta ``run`` and large encodes; threads named ``reactant-hook_*``.

    ``size`` defaults to :func:`hook_pool_size` ``()``; a worker passes
    ``hook_pool_size(config)``.
    """
    workers = hook_pool_size() if size is None else size
    if workers < 1:
        raise ValueError(f"hook pool size must be >= 1, got {workers}")
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix=THREAD_NAME_PREFIX
    )


async def run_in_pool(
    pool: concurrent.futures.Executor, fn: Callable[[*_Ts], _T], *args: *_Ts
) -> _T:
    """``await fn(*args)`` run on ``pool``, so the event loop never executes it.

    The caller's context variables are copied into the call (like :func:`asyncio.to_thread`).
    Cancelling the await does not stop a call that has started; its result is discarded.
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()

    def call() -> _T:
        return context.run(fn, *args)

    return await loop.run_in_executor(pool, call)
