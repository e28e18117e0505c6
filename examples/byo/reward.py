"""The user guide's reward: the share of the response written with the letters the prompt allows.

It takes `row`, the whole data row, so it can read the row's own field `allowed` (a field kuberl
knows nothing about). kuberl imports this module from the manifest's folder: `reward.function:
reward:allowed_letters` in job.yaml.
"""


def allowed_letters(response: str, row: dict) -> float:
    """1.0 when every character of the response is one of row["allowed"]; 0.0 for an empty response."""
    if not response:
        return 0.0
    return sum(ch in row["allowed"] for ch in response) / len(response)
