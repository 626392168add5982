"""The kernel configuration `make env` installs drops exactly two kernel messages (the TCP warning of every local
kernel, the KeyboardInterrupt of jupyter_client's shutdown SIGINT) and keeps every other warning and error. The
papermill command line with it installed is checked in test_headless.py."""

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
