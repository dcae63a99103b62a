"""Device-placement profiles: YAML -> validated `Profile` -> `EngineConfig` and a placement plan."""
