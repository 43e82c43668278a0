"""What a user runs to diagnose their own runs, outside the pipeline: where the frameworks part on a weights file,
tap by tap (where_they_part, with taps_worker its side in each framework's environment), and the power of the
measured null from its design alone (null_power)."""
