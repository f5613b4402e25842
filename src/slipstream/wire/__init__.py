"""Ground floor: Aeron's wire formats (frames, constants, positions, channel URIs) and their errors.

Imports nothing of slipstream but ``slipstream.errors``; every other floor may import it.
"""
