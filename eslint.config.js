// Lint: type-aware rules against floating and misused promises; generated code excluded.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

/**
 * No error dropped in silence (STYLE.md, anti-patterns): a `catch` clause that does not use
 * its error must say why it cannot matter in a comment inside it; a rejection handler
 * (`.catch(h)`, `.then(f, h)`) that does not, in a comment inside it or right before the
 * statement it is part of, or be `ignoreError('why')` from src/base/errors.ts.
 */
const noSilentCatch = {
  meta: {
    type: 'problem',
    schema: [],
    messages: {
      clause: 'this catch drops the error: use it, or say in a comment inside why it cannot matter',
      handler: "this handler drops the error: use it, say in a comment inside why it cannot matter, or pass ignoreError('why')",
    },
  },
  create(context) {
    const source = context.sourceCode;
    /** True when the node declaring `param` never reads it (or there is no param). */
    const dropped = (owner, param) => {
      if (param === undefined || param === null) return true;
      if (param.type !== 'Identifier') return false;
      const variable = source.getDeclaredVariables(owner).find((v) => v.name === param.name);
      return variable !== undefined && variable.references.length === 0;
    };
    const silent = (node) => source.getCommentsInside(node).length === 0;
    /** The statement `node` is part of: its outermost ancestor below a block. */
    const statementOf = (node) => {
      let at = node;
      while (at.parent && at.parent.type !== 'BlockStatement' && at.parent.type !== 'Program' && at.parent.type !== 'StaticBlock' && at.parent.type !== 'SwitchCase') at = at.parent;
      return at;
    };
    const checkHandler = (handler) => {
      if (handler === undefined || (handler.type !== 'ArrowFunctionExpression' && handler.type !== 'FunctionExpression')) return;
      if (!dropped(handler, handler.params[0]) || !silent(handler)) return;
      if (source.getCommentsBefore(statementOf(handler)).length > 0) return;
      context.report({ node: handler, messageId: 'handler' });
    };
    return {
      CatchClause(node) {
        if (dropped(node, node.param) && silent(node.body)) context.report({ node, messageId: 'clause' });
      },
      CallExpression(node) {
        if (node.callee.type !== 'MemberExpression' || node.callee.property.type !== 'Identifier') return;
        const method = node.callee.property.name;
        if (method === 'catch') checkHandler(node.arguments[0]);
        else if (method === 'then') checkHandler(node.arguments[1]);
      },
    };
  },
};

export default tseslint.config(
  { ignores: ['dist/**', 'src/gen/**', 'node_modules/**', '.cache/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: { allowDefaultProject: ['*.js', 'scripts/*.mjs'] }, tsconfigRootDir: import.meta.dirname },
      globals: { process: 'readonly', console: 'readonly', Buffer: 'readonly', setTimeout: 'readonly', clearTimeout: 'readonly' },
    },
    plugins: { tsbox: { rules: { 'no-silent-catch': noSilentCatch } } },
    rules: {
      'tsbox/no-silent-catch': 'error',
      '@typescript-eslint/no-floating-promises': [
        'error',
        { allowForKnownSafeCalls: [{ from: 'package', package: 'node:test', name: ['test', 'describe', 'it', 'suite'] }] },
      ],
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' }],
      'no-empty': ['error', { allowEmptyCatch: false }],
    },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    extends: [tseslint.configs.disableTypeChecked],
  },
);
