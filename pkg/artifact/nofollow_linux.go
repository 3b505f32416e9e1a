package artifact

import "syscall"

const nofollow = syscall.O_NOFOLLOW
