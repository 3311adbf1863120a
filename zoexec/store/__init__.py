"""The node's shared block store in host memory: creating and filling it from a model folder, write-back fences, and the files it leaves in shared memory."""
