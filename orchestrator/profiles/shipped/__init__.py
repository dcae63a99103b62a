"""Profiles that ship with hetspec (YAML package data); `hetspec profile check NAME` reads them."""
