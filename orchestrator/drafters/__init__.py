"""Drafters: propose k tokens cheaply. All share the `Drafter` interface in `base`."""
