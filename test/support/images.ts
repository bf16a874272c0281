/**
 * The container images the end-to-end tests and the pod benchmark run, built here from what
 * the test setup unpacks (Debian's static busybox, in .cache/busybox) and a static pause
 * compiled from test/fixtures/pause.c: no registry, nothing downloaded at test time. They are
 * written as one OCI image layout archive and imported into a containerd with `ctr`.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync, copyFileSync, chmodSync } from 'node:fs';
import path from 'node:path';
import { repoRoot } from './containerd-clients.js';
import { type Containerd, releaseTraits } from './containerd.js';

/** A busybox image: every applet in /bin, `sh` by default. */
export const BUSYBOX_IMAGE = 'tsbox.test/busybox:1';
/**
 * The sandbox images CRI's podsandbox runs by default: containerd 2.1's, and 2.3's and 2.4's
 * (which CRI also pulls for a pod of any other sandboxer). One stand-in under both names.
 */
export const PAUSE_IMAGES = ['registry.k8s.io/pause:3.10', 'registry.k8s.io/pause:3.10.2'] as const;

const busyboxBinary = path.join(repoRoot, '.cache', 'busybox', 'bin', 'busybox');
const pauseSource = path.join(repoRoot, 'test', 'fixtures', 'pause.c');

const goArch: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ppc64: 'ppc64le', s390x: 's390x' };

interface Blob {
  readonly digest: string;
  readonly size: number;
}

function writeBlob(layout: string, data: Buffer): Blob {
  const hex = createHash('sha256').update(data).digest('hex');
  writeFileSync(path.join(layout, 'blobs', 'sha256', hex), data);
  return { digest: `sha256:${hex}`, size: data.length };
}

/** A root file system as one uncompressed tar layer, reproducible (fixed owners and times). */
function layerOf(root: string, out: string): Buffer {
  execFileSync('tar', ['--sort=name', '--mtime=@0', '--owner=0', '--group=0', '--numeric-owner', '-C', root, '-cf', out, '.']);
  return readFileSync(out);
}

function addImage(layout: string, work: string, name: string, root: string, config: { Cmd?: string[]; Entrypoint?: string[]; Env?: string[]; User?: string }): Record<string, unknown> {
  const layer = layerOf(root, path.join(work, `${path.basename(root)}.tar`));
  const layerBlob = writeBlob(layout, layer);
  const arch = goArch[process.arch] ?? process.arch;
  const imageConfig = Buffer.from(
    JSON.stringify({
      architecture: arch,
      os: 'linux',
      config: { Env: config.Env ?? ['PATH=/bin'], WorkingDir: '/', ...config },
      rootfs: { type: 'layers', diff_ids: [layerBlob.digest] },
    }),
  );
  const configBlob = writeBlob(layout, imageConfig);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...configBlob },
      layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', ...layerBlob }],
    }),
  );
  const manifestBlob = writeBlob(layout, manifest);
  return {
    mediaType: 'application/vnd.oci.image.manifest.v1+json',
    ...manifestBlob,
    platform: { architecture: arch, os: 'linux' },
    annotations: { 'io.containerd.image.name': name, 'org.opencontainers.image.ref.name': name.split(':').pop() },
  };
}

/** Builds the archive under `dir` (once) and returns its path. */
export function buildTestImages(dir: string): string {
  const archive = path.join(dir, 'images.tar');
  if (existsSync(archive)) return archive;
  if (!existsSync(busyboxBinary)) throw new Error(`${busyboxBinary} not found: run scripts/install-containerd.sh (as root)`);
  const work = path.join(dir, 'image-build');
  const layout = path.join(work, 'layout');
  mkdirSync(path.join(layout, 'blobs', 'sha256'), { recursive: true });
  writeFileSync(path.join(layout, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));

  const bb = path.join(work, 'busybox');
  for (const d of ['bin', 'etc', 'tmp', 'proc', 'sys', 'dev', 'root']) mkdirSync(path.join(bb, d), { recursive: true });
  chmodSync(path.join(bb, 'tmp'), 0o1777);
  copyFileSync(busyboxBinary, path.join(bb, 'bin', 'busybox'));
  chmodSync(path.join(bb, 'bin', 'busybox'), 0o755);
  const applets = execFileSync(busyboxBinary, ['--list'], { encoding: 'utf8' }).split('\n').filter((a) => a !== '' && a !== 'busybox');
  for (const applet of applets) symlinkSync('busybox', path.join(bb, 'bin', applet));
  writeFileSync(path.join(bb, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n');
  writeFileSync(path.join(bb, 'etc', 'group'), 'root:x:0:\nnogroup:x:65534:\n');

  const pause = path.join(work, 'pause');
  mkdirSync(pause, { recursive: true });
  execFileSync(process.env['CC'] ?? 'cc', ['-static', '-O2', '-Wall', '-Wextra', '-Werror', '-o', path.join(pause, 'pause'), pauseSource]);

  const manifests = [
    addImage(layout, work, BUSYBOX_IMAGE, bb, { Cmd: ['sh'] }),
    // As the Kubernetes pause image: an entrypoint, and the nobody user.
    addImage(layout, work, PAUSE_IMAGES[0], pause, { Entrypoint: ['/pause'], Env: ['PATH=/'], User: '65535:65535' }),
  ];
  // The same image under its other names.
  const [pauseManifest] = manifests.slice(-1);
  for (const name of PAUSE_IMAGES.slice(1)) {
    manifests.push({ ...pauseManifest, annotations: { 'io.containerd.image.name': name, 'org.opencontainers.image.ref.name': name.split(':').pop() } });
  }
  writeFileSync(path.join(layout, 'index.json'), JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests }));
  execFileSync('tar', ['-C', layout, '-cf', archive, '.']);
  return archive;
}

/**
 * As on a node: the sandbox image is there where the release under test pulls it for every
 * pod, tsbox's too (containerd 2.3 and later); before, a tsbox pod needs no image and none is
 * imported. The archive is built in the containerd's own directory.
 */
export async function importSandboxImageWherePulled(containerd: Containerd): Promise<void> {
  if (releaseTraits().pullsPauseImage) await importTestImages(containerd, containerd.paths.dir);
}

/** Imports the test images into containerd's `namespace` (CRI's is k8s.io) and unpacks them. */
export async function importTestImages(containerd: Containerd, dir: string, namespace = 'k8s.io'): Promise<void> {
  const archive = buildTestImages(dir);
  const result = await containerd.ctr(['images', 'import', archive], { namespace, timeoutMs: 120_000 });
  if (result.code !== 0) throw new Error(`ctr images import failed (${result.code}): ${result.stderr || result.stdout}`);
  const listed = await containerd.ctr(['images', 'ls', '-q'], { namespace });
  for (const name of [BUSYBOX_IMAGE, ...PAUSE_IMAGES]) {
    if (!listed.stdout.split('\n').includes(name)) throw new Error(`image ${name} missing after import: ${listed.stdout}`);
  }
}
