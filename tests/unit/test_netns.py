from tests.conftest import in_loopback_only_netns, interfaces


def test_suite_runs_in_loopback_only_netns() -> None:
    assert in_loopback_only_netns(), interfaces()
