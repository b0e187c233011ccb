"""What the reference 3D workers share: :mod:`.check` (structural prechecks, standard library
only) and :mod:`.load` (trimesh parsing into one validated mesh). Nothing is imported here, so
importing :mod:`.check` never loads numpy or trimesh."""
