"""Four of Faust's own example apps, ported to streamjoin (see README.md)."""
