/**
 * The `technical-metadata@1` measures of a welded triangle mesh.
 *
 * - **watertight**: every undirected edge is shared by exactly two faces;
 * - **windingConsistent**: every edge shared by two faces is walked in opposite directions by
 *   them (edges on a border or shared by more than two faces do not count either way), and a
 *   mesh with no faces is neither;
 * - **components**: connected groups of faces, where sharing a vertex joins two faces;
 * - **volume**: only for a watertight, consistently wound mesh (the divergence theorem needs a
 *   closed, oriented surface), as an absolute value so an inside-out mesh still has one;
 *   otherwise `null` with `volumeUnavailableReason` (`not-requested`, `not-watertight`,
 *   `inconsistent-winding`, checked in that order, as the Python worker does).
 *
 * Numbers that overflow to infinity are refused as `malformed-model`: the contract's numbers are
 * finite.
 */

import type { TechnicalMetadataV1 } from "@accord/contracts";

import { WorkFailure } from "./failure";
import type { Mesh } from "./mesh";

export interface Xyz {
  x: number;
  y: number;
  z: number;
}

/** The result contract, as the generated bindings type it. */
export type TechnicalMetadata = TechnicalMetadataV1;

interface EdgeUse {
  uses: number;
  forward: number; // walked low → high index
}

/** Watertightness and winding from the edge table. */
export function edgeChecks(faces: Uint32Array, vertexCount: number): { watertight: boolean; windingConsistent: boolean } {
  const edges = new Map<number, EdgeUse>();
  for (let f = 0; f < faces.length; f += 3) {
    for (let k = 0; k < 3; k++) {
      const a = faces[f + k]!;
      const b = faces[f + ((k + 1) % 3)]!;
      const key = Math.min(a, b) * vertexCount + Math.max(a, b);
      const use = edges.get(key) ?? { uses: 0, forward: 0 };
      use.uses += 1;
      if (a < b) use.forward += 1;
      edges.set(key, use);
    }
  }
  let watertight = faces.length > 0;
  let windingConsistent = faces.length > 0;
  for (const use of edges.values()) {
    if (use.uses !== 2) watertight = false;
    else if (use.forward !== 1) windingConsistent = false;
  }
  return { watertight, windingConsistent };
}

/** Connected components of the faces (union-find over the vertices they use). */
export function componentCount(faces: Uint32Array, vertexCount: number): number {
  const parent = new Uint32Array(vertexCount);
  for (let v = 0; v < vertexCount; v++) parent[v] = v;
  const find = (v: number): number => {
    while (parent[v] !== v) {
      parent[v] = parent[parent[v]!]!;
      v = parent[v]!;
    }
    return v;
  };
  for (let f = 0; f < faces.length; f += 3) {
    const root = find(faces[f]!);
    for (let k = 1; k < 3; k++) {
      const other = find(faces[f + k]!);
      if (other !== root) parent[other] = root;
    }
  }
  const roots = new Set<number>();
  for (let f = 0; f < faces.length; f++) roots.add(find(faces[f]!));
  return roots.size;
}

export function measure(mesh: Mesh, modelId: string, computeVolume: boolean): TechnicalMetadata {
  const p = mesh.positions;
  const faces = mesh.faces;
  const vertexCount = p.length / 3;
  const min = [Infinity, Infinity, Infinity];
  const max = [-Infinity, -Infinity, -Infinity];
  for (let v = 0; v < p.length; v += 3) {
    for (let k = 0; k < 3; k++) {
      min[k] = Math.min(min[k]!, p[v + k]!);
      max[k] = Math.max(max[k]!, p[v + k]!);
    }
  }
  let area = 0;
  let signed = 0; // six times the signed volume
  for (let f = 0; f < faces.length; f += 3) {
    const a = 3 * faces[f]!, b = 3 * faces[f + 1]!, c = 3 * faces[f + 2]!;
    const ux = p[b]! - p[a]!, uy = p[b + 1]! - p[a + 1]!, uz = p[b + 2]! - p[a + 2]!;
    const vx = p[c]! - p[a]!, vy = p[c + 1]! - p[a + 1]!, vz = p[c + 2]! - p[a + 2]!;
    const cx = uy * vz - uz * vy, cy = uz * vx - ux * vz, cz = ux * vy - uy * vx;
    area += 0.5 * Math.hypot(cx, cy, cz);
    signed += p[a]! * cx + p[a + 1]! * cy + p[a + 2]! * cz;
  }
  const { watertight, windingConsistent } = edgeChecks(faces, vertexCount);
  let volume: number | null = null;
  let reason: TechnicalMetadata["volumeUnavailableReason"] = null;
  if (!computeVolume) reason = "not-requested";
  else if (!watertight) reason = "not-watertight";
  else if (!windingConsistent) reason = "inconsistent-winding";
  else volume = Math.abs(signed) / 6;
  const extents = [0, 1, 2].map((k) => max[k]! - min[k]!);
  if (![...min, ...max, ...extents, area, volume ?? 0].every(Number.isFinite)) {
    throw new WorkFailure("malformed-model", "coordinates are too large to measure (overflow)", false);
  }
  const xyz = (v: number[]): Xyz => ({ x: v[0]!, y: v[1]!, z: v[2]! });
  return {
    modelId,
    format: mesh.format,
    units: mesh.units,
    vertexCount,
    faceCount: faces.length / 3,
    components: componentCount(faces, vertexCount),
    bounds: { min: xyz(min), max: xyz(max) },
    extents: xyz(extents),
    surfaceArea: area,
    volume,
    volumeUnavailableReason: reason,
    watertight,
    windingConsistent,
  };
}
