"""Ray actors that train jobs for real under a ``JobConfig`` and ``Placement``.

The executor only applies decisions; it never makes them."""
