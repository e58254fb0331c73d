"""The kubelet's device plugin API (gRPC `v1beta1.Registration`, `v1beta1.DevicePlugin`) for the real-node
tests' stand-in device plugin: `api.proto` is our transcription of the published API, `api_pb2*.py` are
generated from it (`regenerate.sh`)."""
