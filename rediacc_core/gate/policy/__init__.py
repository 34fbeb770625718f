"""The gate's policy, free of the machine's records: each endpoint named once (`endpoints`), what
each request field may hold (`field_policy`), the core rules (`rules`) and the checks they use
(isolation, mounts and their pins, limits, where a build may fetch from, published ports), and the
finding a rule returns (`findings`)."""
