"""Fixtures for the Kubernetes tests: a real etcd + kube-apiserver (see tests/controlplane/harness.py).

`control_plane` (session scope) is a ControlPlane:
  .url, .ca_file, .kubeconfig (admin, group system:masters), .admin_token, .unprivileged_token
  .client(token=None) -> kubernetes.client.ApiClient (admin when no token)
  .mint_token(namespace, service_account, bound_pod=(name, uid) | None, node=(name, uid) | None,
              audiences=(...), expiration_seconds=3600) -> str
  .write_kubeconfig(path, token) -> Path
  .stop_apiserver() / .start_apiserver()  (same port, same etcd data)
Under CI=true a control plane that cannot be built or started fails the test; otherwise it skips.
"""

from tests.controlplane.fixtures import _apiserver_up_between_tests, control_plane

__all__ = ["_apiserver_up_between_tests", "control_plane"]
