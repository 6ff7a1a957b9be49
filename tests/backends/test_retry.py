"""The one backoff policy that every reconnect and reopen uses."""

from backends.retry import Backoff


def test_the_delay_doubles_from_the_first_up_to_the_cap():
    backoff = Backoff(0.25, 3.0)
    assert [backoff.failed() for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_success_starts_the_delays_over():
    backoff = Backoff(1.0, 30.0)
    backoff.failed(), backoff.failed()
    backoff.succeeded()
    assert backoff.failed() == 1.0


def test_a_cap_below_the_first_delay_is_the_delay():
    assert Backoff(5.0, 2.0).failed() == 2.0
