"""Publishing the node: labels (NodeFeature, Node, file) and the NodeResourceTopology."""
