import type { HostPlatform } from '../controller/types.js';

/** Node's names for CPU architectures, in Go/OCI's spelling. */
const GOARCH: Readonly<Record<string, string>> = {
  x64: 'amd64',
  arm64: 'arm64',
  arm: 'arm',
  ia32: '386',
  ppc64: 'ppc64le',
  s390x: 's390x',
  riscv64: 'riscv64',
  loong64: 'loong64',
  mips: 'mips',
  mipsel: 'mipsle',
};

/** The platform of this host, as Platform answers it. */
export function hostPlatform(): HostPlatform {
  const arch = process.arch;
  let variant = '';
  if (arch === 'arm') {
    const version = (process.config.variables as Record<string, unknown>)['arm_version'];
    variant = `v${typeof version === 'string' || typeof version === 'number' ? version : 7}`;
  }
  return { os: 'linux', architecture: GOARCH[arch] ?? arch, variant };
}
