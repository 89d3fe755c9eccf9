"""Planning a run before any weight is read: each stage's bytes per device on a mesh
(:mod:`~wanjax.planning.plan`), the components' weights (:mod:`~wanjax.planning.weights`) and configs
(:mod:`~wanjax.planning.models`), the mesh and memory mode to suggest (:mod:`~wanjax.planning.meshes`),
the memory one device has here (:mod:`~wanjax.planning.device_memory`) and whether a run fits it
(:mod:`~wanjax.planning.run_memory`). Run-time code, below the jobs and the server."""
