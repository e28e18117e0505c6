"""The environment of examples/agent.yaml: two turns, each asking for a letter, rewarded by how much of the turn
repeats it. The second letter comes only in the observation, so the policy must read what the environment said.

    turn 1: prompt "say c:"        -> policy "cccc"   reward 1.0 / 2
    turn 2: observation " say d:"  -> policy "dddd"   reward 1.0 / 2, done
"""

from __future__ import annotations

from kuberl.envs import EnvStep

TURNS = 2


def share(text: str, letter: str) -> float:
    """The share of `text`'s characters equal to `letter` (0 for an empty text)."""
    return sum(ch == letter for ch in text) / len(text) if text else 0.0


class LetterGame:
    def reset(self, row: dict) -> str:
        self.letter, self.turn = row["answer"], 0
        return row["prompt"]

    def step(self, action_text: str) -> EnvStep:
        reward, self.turn = share(action_text, self.letter) / TURNS, self.turn + 1
        if self.turn >= TURNS:
            return EnvStep("", reward, True)
        self.letter = chr((ord(self.letter) - ord("a") + 1) % 26 + ord("a"))
        return EnvStep(f" say {self.letter}:", reward, False)
