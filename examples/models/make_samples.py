"""Write the sample models Accord ships with, exported by trimesh (a real 3D tool).

Run ``python examples/models/make_samples.py``; it rewrites the files beside it deterministically.
Each model is small and has a known analytic shape, so tests compare measured values with exact
ones:

- ``plate-with-hole.stl``  a 40x40x5 mm square plate with a 20x20 square through-hole (genus 1,
  binary STL, 32 triangles); volume (40² − 20²)·5 = 6000.
- ``icosphere.ply``        an icosphere of radius 10 (2 subdivisions, binary PLY).
- ``torus.obj``            a torus, major radius 20, minor radius 5 (OBJ).
- ``bracket.glb``          two parts in one scene: a 30x10x4 mm block and a 3 mm-radius pin beside
  it (GLB; in metres and Y-up, as glTF specifies).
- ``cube.3mf``             a 10 mm cube in a 3MF package, whose unit is millimetre.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import trimesh

HERE = Path(__file__).resolve().parent


def plate_with_hole(
    outer: float = 40.0, inner: float = 20.0, height: float = 5.0
) -> trimesh.Trimesh:
    """A square ring built face by face: 16 vertices, 32 triangles, watertight, genus 1."""
    o, i = outer / 2, inner / 2
    ring = [(-o, -o), (o, -o), (o, o), (-o, o), (-i, -i), (i, -i), (i, i), (-i, i)]
    vertices = np.array([(x, y, z) for z in (0.0, height) for x, y in ring])
    faces: list[tuple[int, int, int]] = []

    def quad(a: int, b: int, c: int, d: int) -> None:  # counter-clockwise seen from outside
        faces.extend([(a, b, c), (a, c, d)])

    for k in range(4):
        n = (k + 1) % 4
        quad(8 + k, 8 + n, 8 + 4 + n, 8 + 4 + k)  # top ring, facing +z
        quad(k, 4 + k, 4 + n, n)  # bottom ring, facing -z
        quad(k, n, 8 + n, 8 + k)  # outer wall, facing out
        quad(4 + n, 4 + k, 12 + k, 12 + n)  # inner wall, facing the hole
    return trimesh.Trimesh(vertices, np.array(faces), process=False)


def main() -> None:
    plate = plate_with_hole()
    assert plate.is_watertight and plate.is_winding_consistent and plate.volume > 0
    plate.export(HERE / "plate-with-hole.stl")
    trimesh.creation.icosphere(subdivisions=2, radius=10.0).export(HERE / "icosphere.ply")
    torus = trimesh.creation.torus(
        major_radius=20.0, minor_radius=5.0, major_sections=24, minor_sections=12
    )
    torus.export(HERE / "torus.obj", include_normals=False, include_texture=False)
    block = trimesh.creation.box(extents=(0.030, 0.010, 0.004))
    pin = trimesh.creation.cylinder(radius=0.003, height=0.012, sections=24)
    pin.apply_translation((0.025, 0.0, 0.0))
    z_up_to_y_up = trimesh.transformations.rotation_matrix(-np.pi / 2, (1.0, 0.0, 0.0))
    for part in (block, pin):
        part.apply_transform(z_up_to_y_up)
    scene = trimesh.Scene({"block": block, "pin": pin})
    (HERE / "bracket.glb").write_bytes(scene.export(file_type="glb"))
    trimesh.creation.box(extents=(10.0, 10.0, 10.0)).export(HERE / "cube.3mf")


if __name__ == "__main__":
    main()
