"""An environment for tests/integration/test_agent.py: examples/letter_env's game, whose first `step` on a row with
a `hang` path never returns, once per run (the first call to create that file; a restarted process finds it)."""

from __future__ import annotations

import os
import threading

from examples.letter_env import LetterGame


class HangsOnce(LetterGame):
    def reset(self, row: dict) -> str:
        self.hang = row.get("hang")
        return super().reset(row)

    def step(self, action_text: str):
        if self.hang:
            try:
                os.close(os.open(self.hang, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                threading.Event().wait()  # hung for good: only the end of its process frees this thread
        return super().step(action_text)
