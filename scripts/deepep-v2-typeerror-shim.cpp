// The tokenspeed-deepep 2.1.0 wheel's _C.so was linked against a PyTorch that exported
// c10::TypeError(SourceLocation, std::string); the image's PyTorch inherits that constructor
// from c10::Error inline and exports no such symbol. This defines it, forwarding to the
// inherited constructor, so the wheel can be imported on the image's PyTorch.
#include <c10/util/Exception.h>
#include <new>
#include <string>
void eptwin_typeerror_shim(c10::TypeError* self, c10::SourceLocation loc, std::string msg) __asm__(
    "_ZN3c109TypeErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
void eptwin_typeerror_shim(c10::TypeError* self, c10::SourceLocation loc, std::string msg) {
    new (self) c10::TypeError(loc, std::move(msg));
}
