/*
 * Unmounting everything at and below a directory, shared by tsbox-shim (its umount-all mode,
 * at a task's Delete) and tsbox-ctr (a container's rootfs when its init ends). Included by
 * each; needs <errno.h>, <fcntl.h>, <limits.h>, <stdio.h>, <stdlib.h>, <string.h>,
 * <sys/mount.h>, <unistd.h>.
 */
#ifndef TSBOX_UNMOUNT_TREE_H
#define TSBOX_UNMOUNT_TREE_H

/* /proc/self/mountinfo, whole, NUL-terminated; NULL with errno on failure. */
static char *read_mountinfo(void) {
  int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  size_t size = 65536, len = 0;
  char *buf = malloc(size);
  for (;;) {
    if (buf == NULL) break;
    ssize_t n = read(fd, buf + len, size - len - 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      free(buf);
      buf = NULL;
      break;
    }
    len += (size_t)n;
    if (n == 0) {
      buf[len] = '\0';
      break;
    }
    if (len + 1 == size) {
      char *bigger = realloc(buf, size *= 2);
      if (bigger == NULL) free(buf);
      buf = bigger;
    }
  }
  int saved = errno;
  if (close(fd) < 0 && buf != NULL) {
    saved = errno;
    free(buf);
    buf = NULL;
  }
  errno = saved;
  return buf;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo: decoded in place. */
static void unescape_octal(char *s) {
  char *out = s;
  for (; *s != '\0'; s++) {
    if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
      *out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
      s += 3;
    } else {
      *out++ = *s;
    }
  }
  *out = '\0';
}

struct mount_point {
  const char *path;
  size_t order;
};

/* Deepest first; at one path the later mount (the top of the stack) first. */
static int deepest_first(const void *a, const void *b) {
  const struct mount_point *x = a, *y = b;
  size_t lx = strlen(x->path), ly = strlen(y->path);
  if (lx != ly) return lx < ly ? 1 : -1;
  return x->order < y->order ? 1 : -1;
}

/*
 * Unmounts everything at and below ROOT (a real path, not "/"), deepest first, plain umount
 * first as containerd's UnmountRecursive does. In rounds: a busy mount may be busy only with a
 * mount below it that another mount stacked on top hid until now, so it waits for the next
 * round. With DETACH, a busy mount is detached lazily once a whole round unmounted nothing
 * (DETACHED, if given, is told its path); without, that ends the work. The round limit guards
 * against mounts that keep appearing under ROOT. 0 once nothing is mounted there; -1 with WHY.
 */
static int unmount_tree(const char *root, int detach, void (*detached)(const char *path), char *why, size_t whysize) {
  size_t rootlen = strlen(root);
  int lazy = 0;
  char left[PATH_MAX];
  left[0] = '\0';
  for (int round = 0; round < 64; round++) {
    char *info = read_mountinfo();
    if (info == NULL) {
      snprintf(why, whysize, "unmount everything at %s: read /proc/self/mountinfo: %s", root, strerror(errno));
      return -1;
    }
    size_t count = 0, cap = 16;
    struct mount_point *points = malloc(cap * sizeof *points);
    char *save = NULL;
    for (char *line = strtok_r(info, "\n", &save); line != NULL && points != NULL; line = strtok_r(NULL, "\n", &save)) {
      /* id parent major:minor root MOUNTPOINT options ... */
      char *field = line;
      for (int i = 0; i < 4 && field != NULL; i++) field = strchr(field, ' ') != NULL ? strchr(field, ' ') + 1 : NULL;
      if (field == NULL) continue;
      char *end = strchr(field, ' ');
      if (end != NULL) *end = '\0';
      unescape_octal(field);
      if (strncmp(field, root, rootlen) != 0 || (field[rootlen] != '\0' && field[rootlen] != '/')) continue;
      if (count == cap) {
        struct mount_point *more = realloc(points, (cap *= 2) * sizeof *points);
        if (more == NULL) free(points);
        points = more;
        if (points == NULL) break;
      }
      points[count].path = field;
      points[count].order = count;
      count++;
    }
    if (points == NULL) {
      snprintf(why, whysize, "unmount everything at %s: malloc: %s", root, strerror(ENOMEM));
      free(info);
      return -1;
    }
    if (count == 0) {
      free(points);
      free(info);
      return 0;
    }
    qsort(points, count, sizeof *points, deepest_first);
    int progress = 0;
    for (size_t i = 0; i < count; i++) {
      const char *p = points[i].path;
      if (umount2(p, UMOUNT_NOFOLLOW) == 0) {
        progress = 1;
        continue;
      }
      if (errno == EINVAL || errno == ENOENT || (errno == EBUSY && !lazy)) {
        snprintf(left, sizeof left, "%s", p);
        continue;
      }
      if (errno == EBUSY && umount2(p, MNT_DETACH | UMOUNT_NOFOLLOW) == 0) {
        progress = 1;
        if (detached != NULL) detached(p);
        continue;
      }
      snprintf(why, whysize, "unmount %s: %s", p, strerror(errno));
      free(points);
      free(info);
      return -1;
    }
    free(points);
    free(info);
    if (!progress && !detach) {
      snprintf(why, whysize, "unmount everything at %s: %s is busy", root, left);
      return -1;
    }
    lazy = !progress;
  }
  snprintf(why, whysize, "unmount everything at %s: %s is still mounted after 64 rounds", root, left);
  return -1;
}

#endif
