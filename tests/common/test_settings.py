"""The limits' settings (services/common/settings.py): read from the environment, a bad
value names its variable."""

from __future__ import annotations

import pytest

from services.common.settings import AdmissionLimits, Settings, SettingsError, TransportLimits

# Admission keeps each call's slot in a context variable: none left behind (conftest.py).
pytestmark = pytest.mark.usefixtures("own_context")


def test_limits_read_from_the_environment_and_bad_values_name_the_variable() -> None:
    limits = AdmissionLimits.from_env({"RUNIFOLD_NAMESPACE_MAX_SEARCHES": "3"})
    assert (limits.searches, limits.turns, limits.limit("propose")) == (3, 8, 4)
    assert AdmissionLimits.from_env({"RUNIFOLD_NAMESPACE_MAX_PROPOSALS": "1"}).limit("propose") == 1
    transport = TransportLimits.from_env({"RUNIFOLD_MAX_CONNECTION_IDLE_S": "0"})
    assert transport.max_receive_message_bytes is None and transport.max_connection_idle_s == 0
    for name, value in (
        ("RUNIFOLD_NAMESPACE_MAX_TURNS", "-1"),
        ("RUNIFOLD_MAX_CONNECTIONS", "many"),
        ("RUNIFOLD_HANDSHAKE_TIMEOUT_S", "0"),
        ("RUNIFOLD_MAX_RECEIVE_MESSAGE_BYTES", "1000"),
    ):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: value})
