"""The instruction's prompt check, off the executor: whether a new task fits the policy's prompt budget.

Tokenising is the policy's work and takes time in proportion to the text; on the executor thread a long task held
every callback (the action timer, /diagnostics) for as long (an 8 MB task: 7 s). ``TaskFitter`` runs the check on
a thread of its own, the newest instruction only (one superseded while waiting never reaches a prompt).
"""
from __future__ import annotations

import threading
from typing import Callable, Optional, Tuple


class TaskFitter:
    """``submit(text, state)`` returns at once; ``fit(text, state) -> (prompt, cut)`` runs on the fitter's thread and
    ``on_cut(text, prompt)`` is called there for a task that was cut, ``on_error(exc)`` if ``fit`` raised."""

    def __init__(self, fit: Callable[[str, object], Tuple[str, bool]], on_cut: Callable[[str, str], None],
                 on_error: Callable[[Exception], None]):
        self._fit, self._on_cut, self._on_error = fit, on_cut, on_error
        self._lock = threading.Lock()
        self._pending: Optional[tuple] = None
        self._thread: Optional[threading.Thread] = None

    def submit(self, text: str, state) -> None:
        with self._lock:
            self._pending = (text, state)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="instruction fit", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                item, self._pending = self._pending, None
                if item is None:
                    self._thread = None
                    return
            text, state = item
            try:
                prompt, cut = self._fit(text, state)
                if cut:
                    self._on_cut(text, prompt)
            except Exception as exc:  # noqa: BLE001 - reported, the node goes on
                self._on_error(exc)

    def idle(self) -> bool:
        """Nothing pending or being checked (tests)."""
        with self._lock:
            return self._thread is None
