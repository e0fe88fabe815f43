"""The platform layer: operating-system mechanisms the rest of pytriton uses through narrow seams.

Modules here import the standard library and ``pytriton.exceptions`` only, never another part of
pytriton (tests/unit/test_import_graph.py holds them to it), so every layer above (``proxy``,
``server``, the serving core) may use them.

- ``paths``: the ownership rule for the files the server and its stubs load (a directory another
  local user may change is refused; files are written without following symlinks).
- ``proc``: the one reader of ``/proc``; ``native``: ``prctl``, inotify, async exceptions.
- ``launch``: the private launch (``ptrace`` argv swap, umask, seccomp chmod filter) and the
  in-process server's confined start thread; ``hardening``: the ``PYTRITON_HARDENING`` switch.
- ``watchdog``: the crash guard, run as a script (``python -S``; it imports only ``proc`` beside it).

Unit tests: tests/unit/test_paths.py.
"""
