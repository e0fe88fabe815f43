"""Command line: ``pytriton serve``, ``install-server``, ``where-server``, ``server-command``, ``run-server``, ``check``.

Also ``python -m pytriton ...``. Unit tests: tests/unit/test_check.py (``check``), tests/unit/test_cli.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

from pytriton import __version__

TOKEN_VARIABLE = "PYTRITON_ACCESS_TOKEN"
"""``run-server`` reads the token here (a process's environment is private to its user, its argv is not)."""


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``pytriton`` command; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="pytriton", description="pytriton command-line tools")
    parser.add_argument("--version", action="version", version=f"pytriton {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    from pytriton import _serve

    serve = commands.add_parser(
        "serve",
        help="serve an application's models: pytriton serve MODULE:ATTRIBUTE (docs/serve.md)",
        description="Import MODULE and serve ATTRIBUTE (a Triton with bound models, a bind_models(triton) "
        "function, or a factory returning a Triton) until SIGINT/SIGTERM. Exit status: 0 after a signal, "
        "1 when the server or the application failed, 2 when the command cannot work as given.",
    )
    _serve.add_arguments(serve)
    install = commands.add_parser(
        "install-server",
        help="download, verify and unpack the Triton Inference Server used by pytriton",
        description="Install Triton Inference Server into $PYTRITON_HOME (default ~/.cache/pytriton).",
    )
    install.add_argument(
        "--from-wheel",
        type=pathlib.Path,
        metavar="PATH",
        help="install from a local nvidia-pytriton wheel instead of downloading it",
    )
    install.add_argument("--force", action="store_true", help="reinstall even if already installed")
    install.add_argument(
        "--triton",
        metavar="VERSION",
        help="the Triton build to install beside the others (e.g. 2.48; default 2.51; "
        "PYTRITON_TRITON_VERSION chooses which one runs; docs/configuration.md)",
    )
    install.add_argument(
        "--find-links",
        type=pathlib.Path,
        metavar="DIR",
        help="offline: folder with a numpy<2 wheel for the stub environment",
    )
    install.add_argument(
        "--no-stub-env", action="store_true", help="do not create the stub's private numpy 1.x environment"
    )
    install.add_argument(
        "--with-pyzmq",
        action="store_true",
        help="also put pyzmq in the stub environment, for RemoteTriton's TCP transport (docs/remote.md)",
    )
    commands.add_parser("where-server", help="print the directory of the server pytriton would use")
    remote = commands.add_parser(
        "server-command",
        help="print the command line of a tritonserver that RemoteTriton can bind into (docs/remote.md)",
    )
    run = commands.add_parser(
        "run-server",
        help="run a tritonserver that RemoteTriton can bind into, its token hidden from other users (docs/remote.md)",
        description=f"Run tritonserver in the foreground until SIGINT/SIGTERM. The token comes from ${TOKEN_VARIABLE} "
        "(or is generated and printed on stderr) and is never in a command line (docs/security.md).",
    )
    for sub in (remote, run):
        sub.add_argument("--model-repository", type=pathlib.Path, required=True, metavar="DIR")
        sub.add_argument("--address", default="127.0.0.1", help="address of the HTTP, gRPC and metrics endpoints")
        sub.add_argument("--http-port", type=int, default=8000)
        sub.add_argument("--grpc-port", type=int, default=8001)
        sub.add_argument("--metrics-port", type=int, default=8002)
    remote.add_argument(
        "--access-token",
        help="token of the restricted management endpoints (default: a random one, printed); "
        "visible to other local users in this command's own command line",
    )
    check = commands.add_parser("check", help="report the environment for a bug report and run a small model")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument("--no-smoke", action="store_true", help="skip the end-to-end run")
    for label in ("http", "grpc", "metrics"):
        check.add_argument(
            f"--{label}-port",
            type=int,
            metavar="PORT",
            help=f"check this {label} port instead of PYTRITON_TRITON_CONFIG_{label.upper()}_PORT or the default",
        )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    from pytriton.exceptions import PyTritonError

    if args.command == "serve":
        return _serve.main(args, argv)
    if args.command == "check":
        from pytriton._check import main as check_main

        ports = {"http": args.http_port, "grpc": args.grpc_port, "metrics": args.metrics_port}
        return check_main(json_output=args.json, smoke=not args.no_smoke, ports=ports)
    try:
        if args.command == "install-server":
            from pytriton.server.install import install_server

            install_server(
                args.from_wheel,
                force=args.force,
                find_links=args.find_links,
                stub_env=not args.no_stub_env,
                stub_pyzmq=args.with_pyzmq,
                progress=_progress,
                triton=args.triton,
            )
        elif args.command == "server-command":
            _print_server_command(args)
        elif args.command == "run-server":
            return _run_server(args)
        elif args.command == "where-server":
            from pytriton.server.distribution import find_server

            print(find_server().root)
    except PyTritonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _server(args: argparse.Namespace, token: Optional[str]) -> Tuple[List[str], Dict[str, str], Optional[str]]:
    """argv, environment and token of the server ``server-command`` prints and ``run-server`` runs."""
    from pytriton._remote import server_command
    from pytriton.server.security import TritonSecurityConfig
    from pytriton.server.triton_config import TritonConfig

    config = TritonConfig(
        http_address=args.address, grpc_address=args.address, metrics_address=args.address,
        http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
    )  # fmt: skip
    security = TritonSecurityConfig(access_token=token)
    argv, env = server_command(args.model_repository, config, security)
    if token is None:
        print(f"# access token (RemoteTriton(access_token=...)): {security.access_token}", file=sys.stderr)
    return argv, env, security.access_token


def _print_server_command(args: argparse.Namespace) -> None:
    from pytriton._remote import command_text

    argv, env, _ = _server(args, args.access_token)
    print(command_text(argv, env))


def _run_server(args: argparse.Namespace) -> int:
    """Run the server in the foreground (private launch: _platform/launch.py); its exit code, or 0 after a signal."""
    import signal

    from pytriton._exit import describe_exit
    from pytriton._platform import launch as _launch
    from pytriton.server.process import _die_with_parent

    argv, env, _ = _server(args, os.environ.get(TOKEN_VARIABLE) or None)
    env.pop(TOKEN_VARIABLE, None)
    # Its own session: a Ctrl-C reaches this process only, which forwards one SIGINT; the server
    # dies with this process (parent-death signal) rather than outliving it with nobody to stop it.
    process = _launch.spawn(
        argv, env, _die_with_parent, stdin=subprocess.DEVNULL, close_fds=True, start_new_session=True
    )
    stopping = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)  # Triton unloads its models and exits on SIGINT

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    returncode = process.wait()
    if stopping:
        return 0
    print(f"tritonserver ended: {describe_exit(returncode)}", file=sys.stderr)
    return returncode if returncode > 0 else 1
