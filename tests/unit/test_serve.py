"""``pytriton serve`` (``pytriton/_serve.py``) without a server: target parsing, loading, options, --reload's pieces.

``pytriton.triton.Triton`` is replaced by a fake, so nothing here starts or binds anything.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import textwrap

import pytest

from pytriton import _cli, _serve


class FakeTriton:
    """Stands in for ``Triton``: records what the command does with it."""

    made: list = []

    def __init__(self) -> None:
        self.bound: list = []
        self.served = False
        self.stopped = False
        FakeTriton.made.append(self)

    def bind(self, name: str) -> None:
        self.bound.append(name)

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture()
def fake_triton(monkeypatch):
    import pytriton.triton

    FakeTriton.made = []
    monkeypatch.setattr(pytriton.triton, "Triton", FakeTriton)
    return FakeTriton


@pytest.fixture()
def app_dir(tmp_path, monkeypatch):
    """A directory for application modules; the modules it gets are forgotten afterwards."""
    before = set(sys.modules)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write(directory: pathlib.Path, name: str, source: str) -> None:
    (directory / name).write_text(textwrap.dedent(source))


@pytest.mark.parametrize("target", ["app", "app:", ":triton", ""])
def test_a_target_without_module_and_attribute_is_refused(target):
    with pytest.raises(_serve.AppError, match="MODULE:ATTRIBUTE"):
        _serve.split_target(target)


def test_a_dotted_attribute_and_a_file_path_split_at_the_last_colon():
    assert _serve.split_target("pkg.app:holder.triton") == ("pkg.app", "holder.triton")
    assert _serve.split_target("/srv/app.py:bind") == ("/srv/app.py", "bind")


def test_a_triton_attribute_is_served_as_it_is(fake_triton, app_dir):
    write(app_dir, "svc_a.py", "import pytriton.triton\ntriton = pytriton.triton.Triton()\ntriton.bind('M')\n")
    triton = _serve.resolve_app("svc_a:triton", app_dir)
    assert isinstance(triton, FakeTriton) and triton.bound == ["M"]
    assert len(FakeTriton.made) == 1


def test_a_bind_function_gets_a_triton_made_by_the_command(fake_triton, app_dir):
    write(app_dir, "svc_b.py", "def bind_models(triton):\n    triton.bind('A')\n    triton.bind('B')\n")
    triton = _serve.resolve_app("svc_b:bind_models", app_dir)
    assert triton.bound == ["A", "B"]


def test_a_bind_function_that_raises_stops_the_triton_it_was_given(fake_triton, app_dir):
    write(app_dir, "svc_c.py", "def bind_models(triton):\n    raise RuntimeError('no weights')\n")
    with pytest.raises(RuntimeError, match="no weights"):
        _serve.resolve_app("svc_c:bind_models", app_dir)
    assert FakeTriton.made[0].stopped


def test_a_factory_returns_the_triton(fake_triton, app_dir):
    write(app_dir, "svc_d.py", "import pytriton.triton\ndef make():\n    return pytriton.triton.Triton()\n")
    assert isinstance(_serve.resolve_app("svc_d:make", app_dir), FakeTriton)


def test_a_factory_returning_something_else_is_named(fake_triton, app_dir):
    write(app_dir, "svc_e.py", "def make():\n    return 42\n")
    with pytest.raises(_serve.AppError, match="returned a int, not a Triton"):
        _serve.resolve_app("svc_e:make", app_dir)


def test_an_attribute_of_the_wrong_kind_is_named(fake_triton, app_dir):
    write(app_dir, "svc_f.py", "triton = 'not a server'\n")
    with pytest.raises(_serve.AppError, match="is a str; it must be a Triton"):
        _serve.resolve_app("svc_f:triton", app_dir)


def test_a_function_of_two_parameters_is_refused(fake_triton, app_dir):
    write(app_dir, "svc_g.py", "def bind(triton, other):\n    pass\n")
    with pytest.raises(_serve.AppError, match="takes 2 required parameters"):
        _serve.resolve_app("svc_g:bind", app_dir)


def test_a_missing_attribute_lists_the_module_names(fake_triton, app_dir):
    write(app_dir, "svc_h.py", "triton = None\ndef bind_models(t):\n    pass\n")
    with pytest.raises(_serve.AppError, match="no attribute 'tritn'; its public names: bind_models, triton"):
        _serve.resolve_app("svc_h:tritn", app_dir)


def test_a_missing_module_names_where_it_was_looked_for(fake_triton, app_dir):
    with pytest.raises(_serve.AppError, match=r"no module named 'no_such_app' \(looked in .*--app-dir"):
        _serve.resolve_app("no_such_app:triton", app_dir)


def test_a_missing_dependency_of_the_application_is_the_applications_error(fake_triton, app_dir):
    write(app_dir, "svc_i.py", "import no_such_dependency_xyz\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        _serve.resolve_app("svc_i:triton", app_dir)


def test_a_py_file_path_is_imported_from_its_directory(fake_triton, app_dir):
    sub = app_dir / "srv"
    sub.mkdir()
    write(sub, "svc_j.py", "def bind_models(triton):\n    triton.bind('J')\n")
    assert _serve.resolve_app(str(sub / "svc_j.py") + ":bind_models", app_dir).bound == ["J"]
    with pytest.raises(_serve.AppError, match="no file"):
        _serve.resolve_app(str(sub / "missing.py") + ":bind_models", app_dir)


def test_options_become_config_variables():
    parser = argparse.ArgumentParser()
    _serve.add_arguments(parser)
    args = parser.parse_args(["app:triton", "--host", "127.0.0.1", "--http-port", "9000", "--log-level", "debug"])
    assert _serve.config_environment(args) == {
        "PYTRITON_TRITON_CONFIG_HTTP_PORT": "9000",
        "PYTRITON_TRITON_CONFIG_HTTP_ADDRESS": "127.0.0.1",
        "PYTRITON_TRITON_CONFIG_GRPC_ADDRESS": "127.0.0.1",
        "PYTRITON_TRITON_CONFIG_METRICS_ADDRESS": "127.0.0.1",
        "PYTRITON_TRITON_CONFIG_LOG_VERBOSE": "1",
    }
    assert _serve.config_environment(parser.parse_args(["app:triton"])) == {}


def test_the_command_exits_2_for_a_target_that_cannot_work(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(os, "environ", dict(os.environ))
    assert _cli.main(["serve", "no_module_xyz:triton", "--app-dir", str(tmp_path)]) == _serve.EXIT_USAGE
    assert "pytriton serve: error: no module named 'no_module_xyz'" in capsys.readouterr().err
    assert _cli.main(["serve", "no-colon"]) == _serve.EXIT_USAGE
    assert "is not MODULE:ATTRIBUTE" in capsys.readouterr().err


def test_the_command_exits_1_when_the_application_raises_at_import(capsys, monkeypatch, app_dir):
    monkeypatch.setattr(os, "environ", dict(os.environ))
    write(app_dir, "svc_k.py", "raise ValueError('weights file is corrupt')\n")
    assert _cli.main(["serve", "svc_k:triton", "--app-dir", str(app_dir)]) == _serve.EXIT_FAILED
    err = capsys.readouterr().err
    assert "ValueError: weights file is corrupt" in err and "loading svc_k:triton raised" in err


def test_a_sigterm_while_the_server_starts_is_handled_and_the_command_exits_0(monkeypatch, app_dir):
    # Seen in CI under load (tests/e2e/test_serve_cli.py): a model answers inside run(), the test sent SIGTERM
    # then, and the command died of it (status -15): `with triton:` had called run() before serve() installed
    # its handlers. run() is a fake here, which sends the SIGTERM only where a handler is in place (the
    # default action would end this test process) and records what it found.
    import signal

    from pytriton.triton import Triton

    monkeypatch.setattr(os, "environ", dict(os.environ))
    write(app_dir, "svc_term.py", "def bind_models(triton):\n    pass\n")
    found: list = []

    def fake_run(self: Triton) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        found.append(handler)
        if callable(handler):
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Triton, "run", fake_run)
    made: list = []
    real_stop = Triton.stop
    monkeypatch.setattr(Triton, "stop", lambda self: made.append(self) or real_stop(self))
    previous = signal.getsignal(signal.SIGTERM)
    status = _cli.main(["serve", "svc_term:bind_models", "--app-dir", str(app_dir), "--log-level", "warning"])
    assert status == _serve.EXIT_OK
    assert found and all(callable(handler) for handler in found), f"run() was called without a handler: {found}"
    assert made and all(triton._state.name == "STOPPED" for triton in made)
    assert signal.getsignal(signal.SIGTERM) == previous  # put back


def test_the_reload_child_is_the_same_command_without_reload():
    command = _serve.child_command(
        ["serve", "app:t", "--reload", "--reload-dir", "src", "--http-port", "9", "--reload-dir=lib"]
    )
    assert command == [sys.executable, "-m", "pytriton", "serve", "app:t", "--http-port", "9"]


def test_source_times_see_py_files_and_skip_caches(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("x\n")
    for skipped in ("__pycache__", ".venv", "site-packages"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "b.py").write_text("y = 2\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "c.py").write_text("z = 3\n")
    times = _serve.source_times([tmp_path])
    assert sorted(pathlib.Path(p).relative_to(tmp_path).as_posix() for p in times) == ["a.py", "pkg/c.py"]
    before = dict(times)
    os.utime(tmp_path / "a.py", (1, 1))
    assert _serve.source_times([tmp_path]) != before
    assert len(_serve.source_times([tmp_path], limit=1)) == 1
