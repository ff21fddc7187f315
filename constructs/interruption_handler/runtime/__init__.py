"""The interruption handler's Lambda code: boto3, the standard library and spotrain's core,
nothing else (the construct zips this folder and the core). `entry.handle` is the function's
entry; `entry`'s docstring is the map."""
