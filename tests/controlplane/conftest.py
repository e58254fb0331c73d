"""The control-plane fixtures for the harness's own tests."""

from tests.controlplane.fixtures import _apiserver_up_between_tests, control_plane

__all__ = ["_apiserver_up_between_tests", "control_plane"]
