"""The kernel configuration `make env` installs drops exactly three kernel messages (the TCP warning of every local
kernel, the KeyboardInterrupt of jupyter_client's shutdown SIGINT, the reply to a papermill that Ctrl-C ended) and
keeps every other warning and error, and shows the project's own errors as their one line. The papermill command line
with it installed is checked in test_headless.py."""

import logging

from widgets.kernel_logs import MARKER, install, quiet_kernel_logs


def test_only_the_two_noise_messages_are_dropped():
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log = logging.getLogger("test-kernel-app")
    log.propagate = False
    log.addHandler(Keep())
    quiet_kernel_logs(log)
    quiet_kernel_logs(log)  # once is enough: no second filter
    assert len(log.filters) == 1
    log.warning("Kernel is running over TCP without encryption. All communication (including code ...)")
    log.error("KeyboardInterrupt caught in kernel.")
    log.error("KeyboardInterrupt caught in kernel")
    log.error("Exception in message handler:")
    log.warning("Failed to load connection file: %r", "x.json")
    assert seen == ["Exception in message handler:", "Failed to load connection file: 'x.json'"]


def test_install_writes_the_config_once_and_keeps_what_was_there(tmp_path):
    cfg = tmp_path / "ipython_kernel_config.py"
    cfg.write_text("c.IPKernelApp.matplotlib = 'inline'")
    assert install(tmp_path) == cfg
    install(tmp_path)
    text = cfg.read_text()
    assert text.startswith("c.IPKernelApp.matplotlib = 'inline'\n") and text.count(MARKER) == 1
    assert "quiet_kernel_logs()" in text


def test_a_reply_to_a_client_that_is_gone_is_dropped_other_handler_errors_kept():
    import zmq

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((record.getMessage(), str(record.exc_info[1]) if record.exc_info else None))

    log = logging.getLogger("test-kernel-app-zmq")
    log.propagate = False
    log.addHandler(Keep())
    quiet_kernel_logs(log)
    for error in (zmq.error.ZMQError(zmq.ENOTSOCK), ValueError("a real bug")):
        try:
            raise error
        except Exception:
            log.error("Exception in message handler:", exc_info=True)
    assert seen == [("Exception in message handler:", "a real bug")]


def test_an_earlier_install_is_replaced_not_doubled(tmp_path):
    from widgets.kernel_logs import OLD_LINES

    cfg = tmp_path / "ipython_kernel_config.py"
    cfg.write_text("x = 1\n" + "\n".join(OLD_LINES) + "\n")
    install(tmp_path)
    text = cfg.read_text()
    assert text.count("quiet_kernel_logs()") == 1 and text.count("short_project_errors()") == 1
    assert text.startswith("x = 1\n" + MARKER)


def test_project_errors_show_as_their_one_line_and_others_keep_the_traceback(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from dflash_lab.config import ConfigError
    from widgets.kernel_logs import short_project_errors

    shell = InteractiveShell.instance()
    try:
        short_project_errors(shell)
        result = shell.run_cell("from dflash_lab import TrainConfig\nTrainConfig(lr=-1)", store_history=False)
        out = capsys.readouterr().out
        assert isinstance(result.error_in_exec, ConfigError)  # the cell still fails
        assert out.strip().splitlines() == ["ConfigError: TrainConfig.lr=-1 is invalid: must be a positive finite "
                                            "number. Fix: use e.g. 6e-4."]
        # a built-in error the project raised naming the fix counts; one raised elsewhere keeps its traceback
        shell.run_cell("from dflash_lab.runs.listing import resolve_runs\nresolve_runs(['/nonexistent'])",
                       store_history=False)
        out = capsys.readouterr().out
        assert out.strip().startswith("FileNotFoundError: '/nonexistent' is not a run directory") and "\n" not in \
            out.strip()
        result = shell.run_cell("1 / 0", store_history=False)
        out = capsys.readouterr().out
        assert isinstance(result.error_in_exec, ZeroDivisionError) and "Traceback" in out and out.count("\n") > 3
    finally:
        InteractiveShell.clear_instance()
