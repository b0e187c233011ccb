"""Accord's Etsy connector: prepare a listing from a model's derived results, publish it once."""
