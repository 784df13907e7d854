"""Small models of what the controllers hvdk8s renders for do with its objects.

Each is written from the controller's own source at a named version, cites the
file and function it follows, and models only what hvdk8s depends on. Tests run
rendered objects through them; what no model covers stays unverified without a
cluster (docs/kubernetes.md, "Not verified without a cluster").
"""
