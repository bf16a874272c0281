/**
 * The Node flags the daemon runs with, wherever it is started: the package's `bin` (the
 * shebang of `main.ts`), the release's launcher, the systemd unit `tsbox install` writes,
 * `npm start`, critest and the tests' daemons.
 *
 * `--max-semi-space-size=1` caps V8's young generation at 1 MiB per semi-space (Node 20's
 * default grows it to 16). tsbox allocates a little per call and keeps little (about 30 KiB of
 * live objects per pod); an uncapped young generation grows towards its maximum as pods come,
 * and its pages stay resident. Measured through CRI with 8 pods after 12 came and went: tsbox
 * 57.7 MiB of PSS against 79.0 uncapped, and 87 KiB of growth per pod held against 798.
 */
export const DAEMON_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=1'];
