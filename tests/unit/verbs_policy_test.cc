// Verbs across hosts on a software RDMA device (Soft-RoCE, soft-iWARP) is
// slower than the kernel TCP it would replace: auto keeps such connections
// on TCP unless asked for (verbs/policy.h). The device's facts are injected:
// no RDMA device needed.
#include <gtest/gtest.h>

#include "verbs/policy.h"

namespace rdmashim::verbs {
namespace {

DeviceFacts hardware(const char* name = "mlx5_0") {
  DeviceFacts f;
  f.name = name;
  f.vendor_id = 0x02c9;  // Mellanox
  f.sysfs_seen = true;
  f.has_parent = true;  // its PCI function
  return f;
}

DeviceFacts rxe(const char* name = "rxe0") {
  DeviceFacts f;
  f.name = name;
  f.vendor_id = kRxeVendorId;
  f.sysfs_seen = true;
  f.has_parent = false;
  return f;
}

TEST(VerbsPolicy, HardwareDeviceUsesVerbsAcrossHosts) {
  Judgement j = judge(hardware(), TransportChoice::kAuto, false);
  EXPECT_FALSE(j.software);
  EXPECT_TRUE(j.remote_allowed);
  EXPECT_NE(j.reason.find("hardware"), std::string::npos) << j.reason;
}

TEST(VerbsPolicy, SoftRoceStaysOnTcpUnderAuto) {
  Judgement j = judge(rxe(), TransportChoice::kAuto, false);
  EXPECT_TRUE(j.software);
  EXPECT_FALSE(j.remote_allowed);
  EXPECT_NE(j.evidence.find("0xffffff"), std::string::npos) << j.evidence;
  EXPECT_NE(j.evidence.find("no parent device"), std::string::npos) << j.evidence;
  EXPECT_NE(j.reason.find("stay on TCP"), std::string::npos) << j.reason;
  EXPECT_NE(j.reason.find("RDMASHIM_SOFT_VERBS=1"), std::string::npos) << j.reason;
}

// The name is the user's choice (rdma link add NAME type rxe): a renamed
// Soft-RoCE device is still known by its vendor id and missing parent.
TEST(VerbsPolicy, RenamedSoftRoceIsStillSoftware) {
  Judgement j = judge(rxe("roce_eth0"), TransportChoice::kAuto, false);
  EXPECT_TRUE(j.software);
  EXPECT_FALSE(j.remote_allowed);
  EXPECT_EQ(j.evidence.find("named"), std::string::npos) << j.evidence;
}

TEST(VerbsPolicy, SoftIwarpIsSoftware) {
  DeviceFacts f = rxe("siw_eth0");
  f.vendor_id = kSiwVendorId;
  Judgement j = judge(f, TransportChoice::kAuto, false);
  EXPECT_TRUE(j.software);
  EXPECT_FALSE(j.remote_allowed);
  EXPECT_NE(j.evidence.find("soft-iWARP"), std::string::npos) << j.evidence;
}

// Each sign alone is enough.
TEST(VerbsPolicy, AnyOneSignMakesItSoftware) {
  DeviceFacts no_parent = hardware("weird0");
  no_parent.has_parent = false;
  EXPECT_TRUE(judge(no_parent, TransportChoice::kAuto, false).software);
  DeviceFacts vendor = hardware("weird1");
  vendor.vendor_id = kRxeVendorId;
  EXPECT_TRUE(judge(vendor, TransportChoice::kAuto, false).software);
  EXPECT_TRUE(judge(hardware("rxe_eth0"), TransportChoice::kAuto, false).software);
}

// Without sysfs (a container) a missing parent proves nothing.
TEST(VerbsPolicy, NoSysfsSaysNothingAboutTheParent) {
  DeviceFacts f = hardware();
  f.sysfs_seen = false;
  f.has_parent = false;
  EXPECT_FALSE(judge(f, TransportChoice::kAuto, false).software);
}

TEST(VerbsPolicy, AskedForSoftwareVerbsUsesThem) {
  Judgement forced = judge(rxe(), TransportChoice::kAuto, true);
  EXPECT_TRUE(forced.software);
  EXPECT_TRUE(forced.remote_allowed);
  EXPECT_NE(forced.reason.find("RDMASHIM_SOFT_VERBS=1 asks"), std::string::npos) << forced.reason;
  Judgement verbs = judge(rxe(), TransportChoice::kVerbs, false);
  EXPECT_TRUE(verbs.remote_allowed);
  EXPECT_NE(verbs.reason.find("RDMASHIM_TRANSPORT=verbs"), std::string::npos) << verbs.reason;
}

}  // namespace
}  // namespace rdmashim::verbs
