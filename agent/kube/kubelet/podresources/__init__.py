"""The kubelet's pod-resources API (gRPC `v1.PodResourcesLister`): which devices each container holds.

`api.proto` is our transcription of the published API; `api_pb2*.py` are generated from it
(`regenerate.sh`); `client` reads the socket; `locality` turns GPU assignments into NUMA preferences.
"""
