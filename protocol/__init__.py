"""Block-descriptor protocol (descriptors, codecs, transports, pinned staging).

Not built yet: tracked as its own issue. Nothing imports this package today.
"""
