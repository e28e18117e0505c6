"""An environment for tests/integration/test_agent.py: examples/letter_env's game, whose first `step` on the row
marked `hang_here` never returns, once per run (the first call to create the file named by the rows' `hang`; a
restarted process finds it there). Once it has hung, each `reset` takes 0.1 s, so that the steps after it last
long enough for the hung call to age past the actor's wait on any machine."""

from __future__ import annotations

import os
import threading
import time

from examples.letter_env import LetterGame
from kuberl.envs import EnvStep

SLOW_RESET_S = 0.1


class HangsOnce(LetterGame):
    """LetterGame, hung for good in the first `step` of the row marked `hang_here`."""

    def reset(self, row: dict) -> str:
        self.marker, self.hang_here = row["hang"], row.get("hang_here", False)
        if os.path.exists(self.marker):
            time.sleep(SLOW_RESET_S)
        return super().reset(row)

    def step(self, action_text: str) -> EnvStep:
        if self.hang_here:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                threading.Event().wait()  # hung for good: only the end of its process frees this thread
        return super().step(action_text)
