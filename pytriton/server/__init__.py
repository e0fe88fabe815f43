"""Everything about the ``tritonserver`` process: finding, installing, configuring, running it."""
