import { spawn } from 'node:child_process';
const c = spawn('runc', ['--root', '/tmp/rb/root', 'create', '--bundle', '/tmp/rb/bundle', 'rpz'], { stdio: ['ignore', 'ignore', 'pipe'] });
c.stderr.on('data', (d) => process.stdout.write('ERR ' + d));
c.on('exit', (code) => console.log('exit', code));
