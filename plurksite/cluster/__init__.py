"""A cluster of hosts made of Linux network namespaces on one machine (issue 16).

- ``netns``: the network itself (bridge plk0, one namespace per host, veth links, partitions,
  delay) over ``ip`` and ``tc``;
- ``topology``: which hosts there are, their addresses, roles and PLURK_* variables;
- ``postgres``: a PostgreSQL cluster in a temporary directory (the db host's, and the tests');
- ``harness``: ``Cluster``, which brings all of it up, runs each host's services in its
  namespace and removes everything on exit.

Importing this package is cheap: it imports neither Django nor the harness.
"""


class ClusterError(RuntimeError):
    """The cluster cannot be built or driven; the message is one line naming the fix or the
    failing command with its error."""
