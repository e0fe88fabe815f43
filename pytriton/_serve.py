"""``pytriton serve MODULE:ATTRIBUTE``: serve an application's models from the command line.

The shape follows ``uvicorn module:app``: the target names a module (imported with the application
directory first on ``sys.path``) or a ``.py`` file, and an attribute in it, which is one of

* a :class:`~pytriton.triton.Triton` with its models bound (created at import, not yet running);
* a function of one parameter, ``bind_models(triton)``, that binds models on the ``Triton`` the
  command creates;
* a function of no parameter that returns such a ``Triton`` (a factory).

The command's options (``--host``, ``--http-port``, ``--grpc-port``, ``--metrics-port``) become
``PYTRITON_TRITON_CONFIG_*`` variables before the application is imported, so a ``Triton()`` created
at import time picks them up as it picks up any such variable; a field the application sets itself in
its ``TritonConfig`` wins, and the command says so.

Exit status (for systemd's ``Restart=on-failure`` and Kubernetes' restart policy):

* 0: stopped by SIGINT or SIGTERM, after the drain;
* 1: the server failed (it could not start, or could not be restarted), or the application raised
  while it was imported or bound: restarting may help;
* 2: the command cannot work as given (a module, file or attribute that does not exist, an attribute
  of the wrong kind, bad options): restarting will not help (``RestartPreventExitStatus=2``).

``--reload`` (development): this process watches the application's ``.py`` files and runs the server
in a child process (the same command without ``--reload``), which it stops with SIGTERM and starts
again when a file changes. A child that fails is started again at the next change.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from pytriton.triton import Triton

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

# How often --reload looks at the files' modification times. Polling, as uvicorn's StatReload
# does without watchfiles: no extra dependency, and a few hundred files cost microseconds.
RELOAD_POLL_S = 0.5
# How long --reload waits for a stopped child before it is killed (its drain is bounded by
# exit_timeout_secs; this is the backstop).
RELOAD_STOP_TIMEOUT_S = 60.0


class AppError(Exception):
    """The target cannot be loaded as given; the message says what is wrong and how to fix it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` subcommand's arguments (``pytriton/_cli.py`` adds the subcommand)."""
    parser.add_argument(
        "target",
        metavar="MODULE:ATTRIBUTE",
        help="a Triton with bound models, a bind_models(triton) function, or a factory returning a Triton; "
        "MODULE is a module name (found from --app-dir) or a path to a .py file",
    )
    parser.add_argument("--host", help="address of the HTTP, gRPC and metrics endpoints (default: every interface)")
    parser.add_argument("--http-port", type=int, metavar="PORT", help="HTTP port (default 8000)")
    parser.add_argument("--grpc-port", type=int, metavar="PORT", help="gRPC port (default 8001)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT", help="metrics port (default 8002)")
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="level of Python logging (pytriton's and the application's); debug also turns on Triton's verbose log",
    )
    parser.add_argument(
        "--app-dir",
        type=pathlib.Path,
        default=pathlib.Path("."),
        metavar="DIR",
        help="directory put first on sys.path to import MODULE (default: the current directory)",
    )
    parser.add_argument(
        "--reload", action="store_true", help="restart the server when a .py file changes (development)"
    )
    parser.add_argument(
        "--reload-dir",
        type=pathlib.Path,
        action="append",
        metavar="DIR",
        help="directory whose .py files --reload watches (repeatable; default: --app-dir)",
    )


def config_environment(args: argparse.Namespace) -> Dict[str, str]:
    """The ``PYTRITON_TRITON_CONFIG_*`` variables the options stand for."""
    env: Dict[str, str] = {}
    for field in ("http_port", "grpc_port", "metrics_port"):
        value = getattr(args, field)
        if value is not None:
            env[f"PYTRITON_TRITON_CONFIG_{field.upper()}"] = str(value)
    if args.host is not None:
        for endpoint in ("HTTP", "GRPC", "METRICS"):
            env[f"PYTRITON_TRITON_CONFIG_{endpoint}_ADDRESS"] = args.host
    if args.log_level == "debug":
        env.setdefault("PYTRITON_TRITON_CONFIG_LOG_VERBOSE", "1")
    return env


def split_target(target: str) -> Tuple[str, str]:
    """``"module:attribute"`` -> its two parts; raises :class:`AppError` for any other shape."""
    module, sep, attribute = target.rpartition(":")
    if not sep or not module or not attribute:
        raise AppError(
            f"{target!r} is not MODULE:ATTRIBUTE; name the module (or .py file) and the Triton or bind function "
            "in it, e.g. 'app:triton' or 'server.py:bind_models'"
        )
    return module, attribute


def import_module(module: str, app_dir: pathlib.Path) -> object:
    """Import ``module`` (a dotted name, found from ``app_dir`` first, or a path to a ``.py`` file).

    A module that does not exist raises :class:`AppError`; an exception raised by the module's own code
    propagates (the application is broken, not the command line).
    """
    if module.endswith(".py"):
        path = pathlib.Path(module)
        if not path.is_absolute():
            path = app_dir / path
        if not path.is_file():
            raise AppError(f"no file {str(path)!r}: give the path of the application's .py file (or its module name)")
        directory = str(path.resolve().parent)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        return importlib.import_module(path.stem)
    directory = str(app_dir.resolve())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # Only when the missing module is the target or one of its packages: a missing dependency
        # of the application is the application's error, reported with its traceback.
        parts = module.split(".")
        if exc.name is not None and exc.name in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            raise AppError(
                f"no module named {exc.name!r} (looked in {directory} and sys.path): "
                "run from the application's directory, or pass --app-dir"
            ) from None
        raise


def resolve_app(target: str, app_dir: pathlib.Path) -> Triton:
    """The ``Triton`` that ``target`` names, bound and not yet running.

    Raises :class:`AppError` for a target that cannot work as given; exceptions of the application's
    own code (at import, in ``bind_models`` or the factory) propagate.
    """
    from pytriton.triton import Triton

    module_name, attribute = split_target(target)
    module = import_module(module_name, app_dir)
    value: object = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            names = sorted(name for name in vars(module) if not name.startswith("_"))
            raise AppError(
                f"module {module_name!r} has no attribute {attribute!r}; its public names: {', '.join(names) or 'none'}"
            ) from None
    if isinstance(value, Triton):
        return value
    if not callable(value):
        raise AppError(
            f"{target} is a {type(value).__name__}; it must be a Triton, a bind_models(triton) function or a factory "
            "returning a Triton"
        )
    try:
        parameters = [
            p
            for p in inspect.signature(value).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):
        parameters = []
    if len(parameters) == 1:
        triton = Triton()
        try:
            value(triton)
        except BaseException:
            triton.stop()
            raise
        return triton
    if not parameters:
        made = value()
        if not isinstance(made, Triton):
            raise AppError(f"the factory {target} returned a {type(made).__name__}, not a Triton")
        return made
    raise AppError(
        f"{target} takes {len(parameters)} required parameters; a bind function takes one (the Triton), a factory none"
    )


def _warn_overridden(triton: Triton, env: Dict[str, str]) -> None:
    """Say when the application's own ``TritonConfig`` wins over an option of the command."""
    config = triton._config
    for variable, wanted in env.items():
        field = variable[len("PYTRITON_TRITON_CONFIG_") :].lower()
        actual = getattr(config, field, None)
        if actual is not None and str(actual) != wanted:
            logging.getLogger("pytriton.serve").warning(
                "the application's TritonConfig sets %s=%r, which wins over the command's %s", field, actual, wanted
            )


def serve(args: argparse.Namespace) -> int:
    """Import the application, serve it until SIGINT/SIGTERM; the exit status (module docstring)."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    env = config_environment(args)
    os.environ.update(env)
    from pytriton.exceptions import PyTritonError

    try:
        triton = resolve_app(args.target, args.app_dir)
    except AppError as exc:
        print(f"pytriton serve: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception:
        traceback.print_exc()
        print(f"pytriton serve: error: loading {args.target} raised (traceback above)", file=sys.stderr, flush=True)
        return EXIT_FAILED
    _warn_overridden(triton, env)
    try:
        # Not `with triton:`, whose __enter__ starts the server before serve() has its SIGINT/SIGTERM handlers
        # in place: a model answers inside run(), and a SIGTERM sent then ended the command with the signal's
        # default action (status -15, no drain). serve() starts it with its handlers installed.
        try:
            triton.serve()
        finally:
            triton.stop()  # serve() stops it before it returns or raises; this is for what it did not start
    except PyTritonError as exc:
        print(f"pytriton serve: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    return EXIT_OK


# -- --reload -----------------------------------------------------------------------------------


def source_times(directories: Iterable[pathlib.Path], limit: int = 10_000) -> Dict[str, float]:
    """Modification time of each ``.py`` file under ``directories`` (at most ``limit`` files).

    Hidden directories, virtual environments and caches are skipped: they change without the
    application's source changing.
    """
    skip = {"__pycache__", "node_modules", "site-packages"}
    times: Dict[str, float] = {}
    for directory in directories:
        for root, dirs, files in os.walk(directory):
            dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".")]
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    try:
                        times[path] = os.stat(path).st_mtime
                    except OSError:
                        continue  # removed meanwhile: its absence is the change
                    if len(times) >= limit:
                        return times
    return times


def child_command(argv: Sequence[str]) -> List[str]:
    """The ``serve`` command line of the child: ``argv`` without ``--reload``/``--reload-dir``."""
    command: List[str] = []
    skip_next = False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        if arg == "--reload":
            continue
        if arg == "--reload-dir":
            skip_next = True
            continue
        if arg.startswith("--reload-dir="):
            continue
        command.append(arg)
    return [sys.executable, "-m", "pytriton", *command]


def reload_loop(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the server in a child and restart it on source changes, until SIGINT/SIGTERM; 0 then."""
    directories = [d.resolve() for d in (args.reload_dir or [args.app_dir])]
    command = child_command(argv)
    stop = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in (signal.SIGINT, signal.SIGTERM)}
    say = logging.getLogger("pytriton.serve")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    say.info("--reload: watching .py files under %s", ", ".join(map(str, directories)))
    child: Optional[subprocess.Popen[bytes]] = None
    try:
        times = source_times(directories)
        while not stop.is_set():
            if child is None:
                child = subprocess.Popen(command)
            stop.wait(RELOAD_POLL_S)
            if child.poll() is not None and not stop.is_set():
                say.warning(
                    "the server exited with status %s; waiting for a change to start it again", child.returncode
                )
                while not stop.is_set() and source_times(directories) == times:
                    stop.wait(RELOAD_POLL_S)
                times = source_times(directories)
                child = None
                continue
            now = source_times(directories)
            if now != times:
                changed = sorted(set(now.items()) ^ set(times.items()))
                say.info("--reload: %s changed; restarting the server", changed[0][0] if changed else "a file")
                times = now
                _stop_child(child)
                child = None
    finally:
        if child is not None:
            _stop_child(child)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return EXIT_OK


def _stop_child(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server drains and stops), then SIGKILL past ``RELOAD_STOP_TIMEOUT_S``."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
    try:
        child.wait(RELOAD_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``pytriton serve``: ``argv`` is the command line after ``pytriton`` (for ``--reload``'s child)."""
    try:
        split_target(args.target)
    except AppError as exc:
        print(f"pytriton serve: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if args.reload:
        return reload_loop(args, argv)
    started = time.monotonic()
    status = serve(args)
    logging.getLogger("pytriton.serve").debug("served for %.1f s; exit status %d", time.monotonic() - started, status)
    return status
