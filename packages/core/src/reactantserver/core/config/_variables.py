"""The one scheme of environment variables, and the older names it replaced.

Every variable starts with ``REACTANTSERVER_`` and then names its component:

- ``REACTANTSERVER_WORKER_<KEY_PATH>`` overrides a worker key,
  ``REACTANTSERVER_GATEWAY_<KEY_PATH>`` a gateway key and ``REACTANTSERVER_NODE_<KEY_PATH>`` a
  node-file key (dots become ``_``, letters are upper-cased: ``scheduler.discipline`` is
  ``REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE``);
- the few variables that are not keys are the fixed list :data:`PROCESS_VARIABLES`; each
  component's key table refuses, when it is built, a key whose variable is one of them.

The older names (``INFERENCE_SERVER_*``, ``REACTANT_GATEWAY_*``, ``REACTANT_*``) still work:
:func:`upgrade_env` rewrites an environment to the new names and says, once per older name
found, which name replaces it. Everything here reads a ``Mapping[str, str]`` handed in by the
caller, never ``os.environ``.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Final

import attrs

__all__ = [
    "CACHE_DIR_VARIABLE",
    "CLIENT_MAX_RECV_VARIABLE",
    "CLIENT_MAX_SEND_VARIABLE",
    "GATEWAY_FILE_VARIABLE",
    "GATEWAY_PREFIX",
    "NODE_FILE_VARIABLE",
    "NODE_KEY_VARIABLES",
    "NODE_PREFIX",
    "PREFIX",
    "PROCESS_VARIABLES",
    "REMOVED_VARIABLES",
    "REMOVED_VARIABLE_PREFIXES",
    "RENAMED_PREFIXES",
    "RENAMED_VARIABLES",
    "SUPERVISOR_PID_VARIABLE",
    "WORKER_NAME_VARIABLE",
    "WORKER_PREFIX",
    "WORKER_THREADS_VARIABLE",
    "EnvUpgrade",
    "check_not_process_variable",
    "key_variable",
    "lookup",
    "removed_hint",
    "renamed_to",
    "unknown_variables",
    "upgrade_env",
]

PREFIX: Final = "REACTANTSERVER_"
WORKER_PREFIX: Final = PREFIX + "WORKER_"
GATEWAY_PREFIX: Final = PREFIX + "GATEWAY_"
NODE_PREFIX: Final = PREFIX + "NODE_"


def key_variable(component_prefix: str, path: tuple[str, ...]) -> str:
    """The variable of a key: ``key_variable(WORKER_PREFIX, ("meta", "concurrency"))`` is
    ``REACTANTSERVER_WORKER_META_CONCURRENCY``."""
    return component_prefix + "_".join(path).upper()


NODE_FILE_VARIABLE: Final = NODE_PREFIX + "FILE"
GATEWAY_FILE_VARIABLE: Final = GATEWAY_PREFIX + "FILE"
WORKER_NAME_VARIABLE: Final = WORKER_PREFIX + "NAME"
WORKER_THREADS_VARIABLE: Final = WORKER_PREFIX + "THREADS"
CACHE_DIR_VARIABLE: Final = PREFIX + "CACHE_DIR"
SUPERVISOR_PID_VARIABLE: Final = PREFIX + "SUPERVISOR_PID"
CLIENT_MAX_SEND_VARIABLE: Final = PREFIX + "CLIENT_GRPC_MAX_SEND_MSG_BYTES"
CLIENT_MAX_RECV_VARIABLE: Final = PREFIX + "CLIENT_GRPC_MAX_RECV_MSG_BYTES"

#: The variables that are not keys, and what each is for. No key may have one of these names.
PROCESS_VARIABLES: Final[Mapping[str, str]] = {
    NODE_FILE_VARIABLE: "The node file `reactantserver-node` and `reactantserver-worker` read "
    "(default `/etc/reactantserver/node.yaml`).",
    GATEWAY_FILE_VARIABLE: "The gateway file `reactantserver-gateway` reads when `--config` is "
    "not given; under a node, a gateway file used instead of the one the node writes.",
    WORKER_NAME_VARIABLE: "The node-file worker a `reactantserver-worker` serves (also its "
    "`worker` metric label); the node sets it for each child.",
    WORKER_THREADS_VARIABLE: "Threads of a worker's hook pool (default `min(cpu_count, 16)`); "
    "the node sets it for each child unless set.",
    CACHE_DIR_VARIABLE: "Where caches live when `cache_dir` is empty (default "
    "`$XDG_CACHE_HOME/reactantserver`, else `~/.cache/reactantserver`).",
    SUPERVISOR_PID_VARIABLE: "Set by the node on its children: the supervisor's PID, so that a "
    "child exits when the supervisor dies. Not for users to set.",
    CLIENT_MAX_SEND_VARIABLE: "The Python client's largest gRPC message sent, in bytes "
    "(default 512 MiB), when the constructor does not say.",
    CLIENT_MAX_RECV_VARIABLE: "The Python client's largest gRPC message received, in bytes "
    "(default 512 MiB), when the constructor does not say.",
}

#: Node-file keys with a variable (``reactantserver-node`` applies them; flags win). The node's
#: ``listen.*`` addresses are the gateway's, so they use ``REACTANTSERVER_GATEWAY_LISTEN_*``.
NODE_KEY_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    key_variable(NODE_PREFIX, path): path
    for path in (("role",), ("gpus",), ("cpu_workers",), ("supervisor", "max_restarts"))
}

#: Older names → new names, one by one. A family renamed by prefix is in RENAMED_PREFIXES.
RENAMED_VARIABLES: Final[Mapping[str, str]] = {
    "REACTANT_NODE_FILE": NODE_FILE_VARIABLE,
    "REACTANT_WORKER_NAME": WORKER_NAME_VARIABLE,
    "REACTANT_WORKER_THREADS": WORKER_THREADS_VARIABLE,
    "REACTANT_CACHE_DIR": CACHE_DIR_VARIABLE,
    "REACTANT_SUPERVISOR_PID": SUPERVISOR_PID_VARIABLE,
    "REACTANT_ROLE": key_variable(NODE_PREFIX, ("role",)),
    "REACTANT_GPUS": key_variable(NODE_PREFIX, ("gpus",)),
    "REACTANT_CPU_WORKERS": key_variable(NODE_PREFIX, ("cpu_workers",)),
    "REACTANT_SUPERVISOR_MAX_RESTARTS": key_variable(NODE_PREFIX, ("supervisor", "max_restarts")),
    # ReactantServer.jl's names of the meta settings.
    "REACTANT_META_CONCURRENCY": key_variable(WORKER_PREFIX, ("meta", "concurrency")),
    "REACTANT_FANOUT_BYTES": key_variable(WORKER_PREFIX, ("meta", "scratch_bytes")),
    "REACTANT_FANOUT_SLOTS": key_variable(WORKER_PREFIX, ("meta", "scratch_slots")),
    # The gateway's short name of health.wedge_exit_rounds.
    "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS": key_variable(
        GATEWAY_PREFIX, ("health", "wedge_exit_rounds")
    ),
    "REACTANT_CLIENT_GRPC_MAX_SEND_MSG_BYTES": CLIENT_MAX_SEND_VARIABLE,
    "REACTANT_CLIENT_GRPC_MAX_RECV_MSG_BYTES": CLIENT_MAX_RECV_VARIABLE,
}
#: Older prefixes → new prefixes: every variable of the family keeps the rest of its name.
RENAMED_PREFIXES: Final[Mapping[str, str]] = {
    "INFERENCE_SERVER_": WORKER_PREFIX,
    "REACTANT_GATEWAY_": GATEWAY_PREFIX,
}

#: Removed worker variables and their hints (new spelling; the older one is caught too).
REMOVED_VARIABLES: Final[Mapping[str, str]] = {
    WORKER_PREFIX + "RUNTIME_RESIDENCY_MODE": "use model_control_mode",
    WORKER_PREFIX + "SCHEDULER_DISPATCH_TIMEOUT_SECONDS": "no execution watchdog exists",
}
#: Removed families of worker variables, matched by prefix, and their hints.
REMOVED_VARIABLE_PREFIXES: Final[Mapping[str, str]] = {
    WORKER_PREFIX + "BATCH_POLICY_": "use scheduler.models.<m>.max_batch_size",
}


def renamed_to(variable: str) -> str | None:
    """The new name of an older ``variable``; ``None`` when it is not an older name."""
    new = RENAMED_VARIABLES.get(variable)
    if new is not None:
        return new
    for old, prefix in RENAMED_PREFIXES.items():
        if variable.startswith(old):
            return prefix + variable.removeprefix(old)
    return None


def removed_hint(variable: str) -> str | None:
    """The hint of a removed variable, in its new or its older spelling; else ``None``."""
    name = renamed_to(variable) or variable
    hint = REMOVED_VARIABLES.get(name)
    if hint is not None:
        return hint
    for prefix, family_hint in REMOVED_VARIABLE_PREFIXES.items():
        if name.startswith(prefix):
            return family_hint
    return None


def check_not_process_variable(variable: str, path: tuple[str, ...]) -> None:
    """Refuse a key whose variable is a process variable (a schema change must rename one)."""
    if variable in PROCESS_VARIABLES:
        raise RuntimeError(f"key {'.'.join(path)} would be set by the process variable {variable}")


@attrs.frozen
class EnvUpgrade:
    """An environment with the older names replaced, and one message per older name found."""

    env: Mapping[str, str]
    messages: tuple[str, ...]


def _rank(variable: str) -> int:
    # Among older names of one variable, a prefix family's (the key's own name) beats a short one.
    return 1 if variable in RENAMED_VARIABLES else 0


def upgrade_env(env: Mapping[str, str]) -> EnvUpgrade:
    """``env`` with every older name replaced by its new name; the messages say which.

    The new name wins when both are set, then the older key-derived name
    (``INFERENCE_SERVER_META_CONCURRENCY``), then the older short name
    (``REACTANT_META_CONCURRENCY``). The older names are left out of the result, so a child
    started with it, or a second call, sees (and reports) nothing old. Removed variables are
    left as they are, for the component to refuse with their hint.
    """
    found: dict[str, list[str]] = {}
    for variable in env:
        new = renamed_to(variable)
        if new is not None and removed_hint(variable) is None:
            found.setdefault(new, []).append(variable)
    if not found:
        return EnvUpgrade(env, ())
    upgraded = {name: value for name, value in env.items() if renamed_to(name) not in found}
    messages: list[str] = []
    for new, olds in found.items():
        olds.sort(key=lambda old: (_rank(old), old))
        winner = new if new in env else olds[0]
        upgraded[new] = env[winner]
        for old in olds:
            if old == winner:
                messages.append(f"{old} is deprecated; use {new}")
            elif winner == new:
                messages.append(f"{old} is deprecated and ignored: {new} is set too and wins")
            else:
                messages.append(
                    f"{old} is deprecated and ignored: {winner} is set too and wins; use {new}"
                )
    return EnvUpgrade(upgraded, tuple(sorted(messages)))


def lookup(env: Mapping[str, str], variable: str) -> tuple[str | None, str]:
    """The value of ``variable`` in ``env``, else of its older name, and the name it came from.

    For a process that reads one variable without :func:`upgrade_env` (the client).
    """
    if variable in env:
        return env[variable], variable
    for old, new in RENAMED_VARIABLES.items():
        if new == variable and old in env:
            return env[old], old
    for old, prefix in RENAMED_PREFIXES.items():
        if variable.startswith(prefix) and (name := old + variable.removeprefix(prefix)) in env:
            return env[name], name
    return None, variable


def unknown_variables(
    env: Mapping[str, str], component_prefix: str, known: Collection[str]
) -> list[str]:
    """A warning for each ``component_prefix`` variable in ``env`` that is not ``known``.

    Each names the closest known variable when one is close (``did you mean ...?``). The
    process variables and removed variables are not reported here.
    """
    warnings: list[str] = []
    candidates = sorted({*known, *(v for v in PROCESS_VARIABLES if v.startswith(component_prefix))})
    for variable in sorted(env):
        if (
            not variable.startswith(component_prefix)
            or variable in known
            or variable in PROCESS_VARIABLES
            or removed_hint(variable) is not None
        ):
            continue
        close = difflib.get_close_matches(variable, candidates, n=1)
        suggestion = f" (did you mean {close[0]}?)" if close else ""
        warnings.append(f"ignoring unknown variable {variable}{suggestion}")
    return warnings
